"""The graph optimiser (optimize.py): a CPU TorchScript model at fp32 serves its
optimize_for_inference graph when that answers as the file does and is not slower; a pass that
fails, changes the outputs or runs slower leaves the model as loaded, and /v1/model says why."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import rt_models
import torch
from torch import nn
from torchfleet_runtime import demo, optimize
from torchfleet_runtime.config import Config
from torchfleet_runtime.model import load
from torchfleet_runtime.warmup import load_sample

pytestmark = pytest.mark.timeout(120)

SHAPE = (3, 8, 8)


class ConvBn(nn.Module):
    """Convolution + batch norm (what freezing folds) + a linear head, small enough to be quick."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 5)
        with torch.no_grad():  # a trained-looking norm, so folding it really changes the weights
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


@pytest.fixture(scope="module")
def convbn_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("convbn") / "convbn.pt"
    torch.jit.script(ConvBn().eval()).save(str(path))
    return path


def loaded_from(path: Path, **kw):
    cfg = Config(model=str(path), input_shape=SHAPE, device="cpu", **kw)
    loaded = load(cfg)
    return loaded, load_sample(None, loaded.metadata), cfg


def test_the_optimised_graph_answers_as_the_file_does(convbn_file, monkeypatch):
    # What this test is about is the answer, not the speed: on a busy machine the start-up
    # timing can see the graph below the refusal threshold (0.89x was seen under four parallel
    # test runs), which the slower-candidate case below covers with a graph that really is slower.
    monkeypatch.setattr(optimize, "SLOWER", 0.0)
    loaded, sample, cfg = loaded_from(convbn_file)
    original = loaded.predictor
    out = optimize.optimize(loaded, sample, cfg.optimize)
    assert out.optimization["method"] == "optimize_for_inference", out.optimization
    assert out.predictor is not original and out.optimization["speedup"] > 0
    x = torch.randn(6, *SHAPE)
    with torch.no_grad():
        want = torch.jit.load(str(convbn_file))(x)
    got = out.predictor(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "replacement, reason",
    [
        ("shifted", "changed the outputs: outputs: differ by up to 1"),
        ("raises", "optimize_for_inference failed: this graph has an op the pass cannot take"),
        ("slower", "optimize_for_inference was slower"),
        (
            "reshaped",
            "changed the outputs: outputs: tensor (4, 5) torch.float32 became tensor (4, 10)",
        ),
    ],
)
def test_a_pass_that_fails_changes_outputs_or_is_slower_leaves_the_model_as_loaded(
    convbn_file, monkeypatch, replacement, reason
):
    real = torch.jit.optimize_for_inference

    def replaced(module):
        good = real(module)
        if replacement == "raises":
            raise RuntimeError("this graph has an op the pass cannot take\n(a C++ trace follows)")
        if replacement == "shifted":
            return lambda x: good(x) + 1.0
        if replacement == "reshaped":
            return lambda x: torch.cat([good(x), good(x)], 1)

        def slow(x):
            time.sleep(0.05)  # the real graph runs in about a millisecond here
            return good(x)

        return slow

    monkeypatch.setattr(torch.jit, "optimize_for_inference", replaced)
    loaded, sample, cfg = loaded_from(convbn_file)
    original = loaded.predictor
    out = optimize.optimize(loaded, sample, cfg.optimize)
    assert out.predictor is original
    assert out.optimization["method"] is None and reason in out.optimization["reason"]
    assert "\n" not in out.optimization["reason"]


def test_where_the_pass_does_not_apply_the_reason_is_recorded(convbn_file):
    loaded, sample, _ = loaded_from(convbn_file)
    assert optimize.optimize(loaded, sample, "off").optimization == {
        "method": None,
        "reason": "optimize: off",
    }
    loaded, sample, cfg = loaded_from(convbn_file, precision="bf16")
    why = optimize.optimize(loaded, sample, cfg.optimize).optimization["reason"]
    assert "autocast" in why
    eager = load(Config(input_shape=(4,), device="cpu"), module=rt_models.tiny())
    why = optimize.optimize(eager, load_sample(None, eager.metadata), "auto").optimization
    assert why == {
        "method": None,
        "reason": "a module model (only TorchScript graphs are optimised)",
    }


def test_outputs_are_compared_by_structure_dtype_and_value_nan_included():
    t = torch.tensor([1.0, float("nan"), 3.0])
    assert optimize.differs(t, t.clone(), "o") == ""
    assert "differ by up to" in optimize.differs(t, t + 0.5, "o")
    assert optimize.differs((t, {"a": t}), (t, {"a": t}), "o") == ""
    assert optimize.differs((t, {"a": t}), (t, {"b": t}), "o") == (
        "o[1]: dict with keys ['a'] became dict with keys ['b']"
    )
    assert optimize.differs([t], (t, t), "o") == "o: list of 1 became tuple of 2"
    ints = torch.tensor([1, 2])
    assert optimize.differs(ints, ints + 1, "o") == "o: integer values differ"
    assert optimize.differs(t, t.double(), "o").endswith("became tensor (3,) torch.float64")


def test_the_demo_model_is_served_optimised_and_the_model_card_says_so(
    tmp_path, start_runtime, client_for
):
    model_path, _ = demo.write_demo_model(tmp_path)
    svc = start_runtime(model=str(model_path), input_shape=None, max_batch_size=4)
    c = client_for(svc)
    status, card = c.get_json("/v1/model")
    assert status == 200
    assert card["optimization"]["method"] == "optimize_for_inference", card["optimization"]
    x = torch.randn(3, 3, 64, 64)
    status, _, doc = c.predict(x.tolist())
    assert status == 200
    with torch.no_grad():
        want = torch.jit.load(str(model_path))(x)
    assert torch.allclose(torch.tensor(doc["outputs"]), want, rtol=1e-4, atol=1e-4)


def test_optimize_off_serves_the_file_as_loaded(tmp_path, start_runtime, client_for):
    model_path, _ = demo.write_demo_model(tmp_path)
    svc = start_runtime(model=str(model_path), input_shape=None, max_batch_size=2, optimize="off")
    status, card = client_for(svc).get_json("/v1/model")
    assert status == 200 and card["optimization"] == {"method": None, "reason": "optimize: off"}
