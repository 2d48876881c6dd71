"""Mosec 0.9.x server of the peer benchmark: POST /inference.

The pipeline Mosec's docs recommend for a model behind a decode step: an ingress worker that
parses the JSON (Mosec's default JSON `deserialize`) into a tensor, feeding a batched inference
worker (`append_worker(..., max_batch_size=N, max_wait_time=MS)`, README "Configuration" and the
PyTorch image-recognition example), whose default `serialize` writes the JSON answer. One
process per stage unless PEERS_DECODE_WORKERS sets the decode stage's processes (the GPU side
by side runs 1 and N); Mosec's other settings are its defaults. PEERS_MOSEC_BIN: Mosec's binary
when it is not in the interpreter's script folders (a `pip install --target` puts it in
TARGET/bin, where Mosec does not look).
Usage: PEERS_MODEL=model.pt python mosec_app.py --port PORT
"""

from __future__ import annotations

import os
from pathlib import Path

import common
import mosec.runtime
from mosec import Server, Worker

if os.environ.get("PEERS_MOSEC_BIN"):
    mosec.runtime.get_mosec_path = lambda: Path(os.environ["PEERS_MOSEC_BIN"])


class Decode(Worker):
    def forward(self, data):
        return common.decode(data)


class Inference(Worker):
    def __init__(self):
        super().__init__()
        self.model = common.load_model()

    def forward(self, data):
        import torch

        out = common.predict(self.model, torch.stack(data))
        return [common.encode(row) for row in out]


if __name__ == "__main__":
    max_batch, wait_ms = common.batch_settings()
    server = Server()
    server.append_worker(Decode, num=int(os.environ.get("PEERS_DECODE_WORKERS", "1")))
    server.append_worker(Inference, num=1, max_batch_size=max_batch, max_wait_time=int(wait_ms))
    server.run()
