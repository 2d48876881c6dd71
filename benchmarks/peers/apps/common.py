"""What every peer's handler does the same way: load the TorchScript file, turn the JSON body
into a tensor, turn one output row into the JSON answer. Runs inside each peer's own virtualenv
(no torchfleet import). The contract is the runtime's: `{"inputs": <one instance>}` in,
`{"outputs": <one row>}` out. PEERS_DEVICE (default cpu) is where the model runs: the GPU side by
side (`torchfleet-bench gpu-peers`) sets cuda; a batch goes there and its output comes back."""

from __future__ import annotations

import os
from typing import Any

import torch


def device() -> str:
    return os.environ.get("PEERS_DEVICE", "cpu")


def load_model(path: str | None = None) -> torch.jit.ScriptModule:
    return torch.jit.load(path or os.environ["PEERS_MODEL"], map_location=device()).eval()


def decode(obj: Any) -> torch.Tensor:
    """One instance (C, H, W) from the parsed JSON body: the idiom each peer's docs use."""
    return torch.tensor(obj["inputs"], dtype=torch.float32)


def predict(model: torch.jit.ScriptModule, batch: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(batch.to(device(), non_blocking=True)).cpu()


def encode(row: torch.Tensor) -> dict[str, list[float]]:
    return {"outputs": row.tolist()}


def batch_settings() -> tuple[int, float]:
    """(max batch size, max wait in ms), the same for every peer: the harness sets them."""
    return int(os.environ.get("PEERS_MAX_BATCH", "16")), float(
        os.environ.get("PEERS_MAX_WAIT_MS", "10")
    )
