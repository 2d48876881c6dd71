"""The demo model: a small ResNet-style CNN, built and saved without any download.

About 1.2 M parameters, input 3x64x64 float32, 10-class logits; weights come from a fixed seed,
so every machine builds the same weights. The sidecar model.json declares a version made from
them (`weights_fingerprint`): two saves of one TorchScript module differ in bytes (torch 2
writes a random serialization id into the archive), so without it every node that generated
its own copy would report its own "sha256:..." version of one model
(torchfleet_compat.model_version). `build_demo_model` doubles as an eager factory
(`--factory torchfleet_runtime.demo:build_demo_model` with a saved state_dict); its `width` and
`stem` build larger members of the same family from the same seed (benchmarks/peers).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

INPUT_SHAPE = (3, 64, 64)
NUM_CLASSES = 10
SEED = 20240601


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18's block)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


STEMS = ("demo", "resnet")
WIDTHS = (32, 64, 128, 256)  # the four stages' channels at width 1


class DemoResNet(nn.Module):
    """Stem, four BasicBlock stages (the last three downsample), global pooling, one linear layer.

    `width` multiplies every stage's channels. `stem`: "demo", one 3x3 stride-1 convolution at
    full resolution (right for 64x64 inputs); "resnet", ResNet's 7x7 stride-2 convolution and 3x3
    stride-2 max-pool, a quarter of the pixels for every later layer (for larger inputs)."""

    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 1, stem: str = "demo") -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be an integer >= 1, got {width!r}")
        if stem not in STEMS:
            raise ValueError(f"stem must be one of {', '.join(STEMS)}, got {stem!r}")
        w = [c * width for c in WIDTHS]
        if stem == "demo":
            self.stem = nn.Sequential(
                nn.Conv2d(3, w[0], 3, 1, 1, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU()
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, w[0], 7, 2, 3, bias=False),
                nn.BatchNorm2d(w[0]),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        self.layers = nn.Sequential(
            BasicBlock(w[0], w[0]),
            BasicBlock(w[0], w[1], stride=2),
            BasicBlock(w[1], w[2], stride=2),
            BasicBlock(w[2], w[3], stride=2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w[3], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def build_demo_model(width: int = 1, stem: str = "demo") -> DemoResNet:
    """Deterministic weights: the same seed (and width, stem) gives the same model on every
    machine. The defaults are the demo model; the peer benchmark's larger model is
    `build_demo_model(width=3, stem="resnet")`."""
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = DemoResNet(width=width, stem=stem)
        # Non-trivial BatchNorm statistics, so eval mode is not an identity.
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None  # tracked stats
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


def weights_fingerprint(model: nn.Module) -> str:
    """A digest of the model's weights (names, shapes and bytes, in state_dict order)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def metadata() -> dict:
    model = build_demo_model()
    return {
        "version": "demo-" + weights_fingerprint(model)[:12],
        "name": "torchfleet-demo-resnet",
        "input_shape": list(INPUT_SHAPE),
        "dtype": "float32",
        "output_shape": [NUM_CLASSES],
        "output_description": f"logits over {NUM_CLASSES} classes (untrained, deterministic weights)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "seed": SEED,
    }


def write_demo_model(out_dir: str | Path) -> tuple[Path, Path]:
    """Write OUT/model.pt (TorchScript) and OUT/model.json; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scripted = torch.jit.script(build_demo_model())
    model_path, meta_path = out / "model.pt", out / "model.json"
    tmp = out / ".model.pt.tmp"
    scripted.save(str(tmp))
    tmp.replace(model_path)  # atomic: a concurrent reader never sees half a file
    meta_path.write_text(json.dumps(metadata(), indent=2) + "\n")
    return model_path, meta_path
