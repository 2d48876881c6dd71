"""LitServe 0.2.x server of the peer benchmark: POST /predict.

Batching as LitServe documents it: `LitAPI(max_batch_size=N, batch_timeout=S)`; decode_request
returns a tensor so LitServe's default `batch` stacks them and the default `unbatch` splits the
output rows (features/batching in the LitServe docs). Everything else is LitServer's default
(accelerator auto -> cpu, one inference worker per device, its own API-server processes).
Usage: PEERS_MODEL=model.pt python litserve_app.py PORT
"""

from __future__ import annotations

import sys

import common
import litserve as ls


class PeerAPI(ls.LitAPI):
    def setup(self, device):
        self.model = common.load_model()

    def decode_request(self, request):
        return common.decode(request)

    def predict(self, x):
        return common.predict(self.model, x)

    def encode_response(self, output):
        return common.encode(output)


if __name__ == "__main__":
    max_batch, wait_ms = common.batch_settings()
    api = PeerAPI(max_batch_size=max_batch, batch_timeout=wait_ms / 1000.0)
    ls.LitServer(api, accelerator="cpu").run(host="127.0.0.1", port=int(sys.argv[1]))
