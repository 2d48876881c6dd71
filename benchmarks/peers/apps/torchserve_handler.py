"""TorchServe 0.12 handler of the peer benchmark: POST /predictions/peer.

BaseHandler loads the TorchScript file of the archive (no model file given) and runs
preprocess -> inference -> postprocess on each batch TorchServe's frontend forms
(`batchSize`/`maxBatchDelay` in model-config.yaml, TorchServe's docs/batch_inference_with_ts.md
and docs/configuration.md). TorchServe's Python worker has already parsed an application/json
body into a dict.
"""

from __future__ import annotations

import common
import torch
from ts.torch_handler.base_handler import BaseHandler


class PeerHandler(BaseHandler):
    def preprocess(self, data):
        return torch.stack([common.decode(row.get("body") or row.get("data")) for row in data])

    def inference(self, data, *args, **kwargs):
        return common.predict(self.model, data)

    def postprocess(self, data):
        return [common.encode(row) for row in data]
