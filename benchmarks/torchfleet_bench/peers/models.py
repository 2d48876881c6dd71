"""The model files and the one request body every server of the peer benchmark gets.

Two models, both TorchScript files written from fixed seeds, so every machine and every server
loads the same bytes:
- `demo`: the runtime's own demo model (`torchfleet-runtime demo-model`), 1.2 M parameters,
  input 3x64x64;
- `wide`: the same ResNet-style network with every layer three times as wide (11.0 M
  parameters) at input 3x128x128, behind ResNet's own downsampling stem (7x7 stride-2 conv +
  3x3 stride-2 max-pool) instead of the demo's full-resolution 3x3 one: with that stem it costs
  0.62 G multiply-adds an item (2.4x the demo model, about ResNet-18 at this size); with the
  demo's stem at 128x128 it would cost 9.1 G (36x), a model that serves a few items/s on two
  cores. It is the runtime's own `build_demo_model(width=3, stem="resnet")`: same seed, same
  family, built by the same code.

The body is JSON `{"inputs": <one instance, nested lists>}` of standard-normal values rounded to
4 decimals (about 7.4 bytes a number: 91 KB for the demo model, 364 KB for the wide one). The expected
answer is the model's output in this process for the tensor that JSON decodes to; each server
must match it (allclose) before it is timed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODELS = ("demo", "wide")
WIDE_INPUT = (3, 128, 128)
WIDE_FACTOR = 3  # demo widths 32/64/128/256 -> 96/192/384/768: 11.03 M parameters
BODY_SEED = 0
DECIMALS = 4


@dataclass(frozen=True)
class ModelFiles:
    name: str
    model: Path  # TorchScript file
    metadata: Path  # the runtime's JSON sidecar (input_shape, dtype)
    body: Path  # the JSON request body
    expected: Path  # JSON list: the in-process output for the body
    input_shape: tuple[int, ...]
    parameters: int

    def expected_outputs(self) -> list[float]:
        return json.loads(self.expected.read_text())


def body_bytes(shape: tuple[int, ...], seed: int = BODY_SEED) -> bytes:
    """One instance of deterministic standard-normal values (a normalised image), 4 decimals,
    compact JSON."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=gen).tolist()

    def rounded(x: Any) -> Any:
        return [rounded(v) for v in x] if isinstance(x, list) else round(x, DECIMALS)

    return json.dumps({"inputs": rounded(values)}, separators=(",", ":")).encode()


def build(name: str, out_dir: Path) -> ModelFiles:
    """Write OUT/<name>/{model.pt, model.json, body.json, expected.json} (idempotent)."""
    import torch
    from torchfleet_runtime import demo

    if name not in MODELS:
        raise ValueError(f"model {name!r}: choose from {', '.join(MODELS)}")
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    if name == "demo":
        model_path, meta_path = demo.write_demo_model(d)
        meta = json.loads(meta_path.read_text())
    else:
        eager = demo.build_demo_model(width=WIDE_FACTOR, stem="resnet")
        model_path, meta_path = d / "model.pt", d / "model.json"
        torch.jit.script(eager).save(str(model_path))
        meta = {
            "name": "peers-wide-resnet",
            "input_shape": list(WIDE_INPUT),
            "dtype": "float32",
            "output_shape": [demo.NUM_CLASSES],
            "parameters": sum(p.numel() for p in eager.parameters()),
            "seed": demo.SEED,
            "note": f"torchfleet_runtime.demo blocks, widths x{WIDE_FACTOR}, ResNet stem (7x7/2 + max-pool/2)",
        }
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    shape = tuple(meta["input_shape"])
    body = body_bytes(shape)
    (d / "body.json").write_bytes(body)
    # The expected answer comes from the saved file, decoded from the body as a server would.
    scripted = torch.jit.load(str(model_path)).eval()
    x = torch.tensor(json.loads(body)["inputs"], dtype=torch.float32).unsqueeze(0)
    with torch.inference_mode():
        expected = scripted(x)[0].tolist()
    (d / "expected.json").write_text(json.dumps(expected) + "\n")
    return ModelFiles(
        name=name,
        model=model_path,
        metadata=meta_path,
        body=d / "body.json",
        expected=d / "expected.json",
        input_shape=shape,
        parameters=int(meta["parameters"]),
    )
