"""The GPU-owner pipeline on a real GPU: pinned double-buffered staging with one non_blocking copy
per batch answers as the eager CPU reference does, a CUDA graph replay equals the eager run per
bucket, a model that cannot be captured falls back to eager with the reason, `cuda_graphs: off`
captures nothing, and an OOM's lowered cap drops the graphs above it. Skipped without CUDA,
never faked (test_pipeline.py proves the staging rules on CPU); `scripts/gpu_check.sh` runs them
on a lent GPU machine."""

from __future__ import annotations

import pytest
import rt_models
import torch
from torch import nn
from torchfleet_runtime import compat, demo
from torchfleet_runtime.batcher import Batcher, BatchInfo
from torchfleet_runtime.config import Config
from torchfleet_runtime.graphs import capture
from torchfleet_runtime.model import Predictor, load
from torchfleet_runtime.optimize import differs
from torchfleet_runtime.worker import Worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]
needs_graphs = pytest.mark.skipif(
    bool(compat.CUDA_GRAPHS_WHY_NOT), reason=compat.CUDA_GRAPHS_WHY_NOT or "graphs available"
)
CUDA = torch.device("cuda")


def _demo(tmp_path) -> tuple[nn.Module, torch.nn.Module]:
    """The demo model on the GPU and its CPU reference (the same TorchScript file)."""
    path, _ = demo.write_demo_model(tmp_path)
    return torch.jit.load(str(path), map_location="cuda").eval(), torch.jit.load(str(path)).eval()


def test_pinned_staging_with_one_copy_per_batch_answers_as_the_cpu_reference(tmp_path):
    gpu, ref = _demo(tmp_path)
    worker = Worker(Predictor(gpu, CUDA, None), "cuda:0")
    assert worker.ahead and worker.stager.count == 2
    b = Batcher([worker], [1, 2, 4, 8, 16], 0.0, max_queue=4096)
    batches: list[BatchInfo] = []
    b.on_batch.append(batches.append)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 3, 64, 64, generator=gen) for n in [3, 1, 5, 16, 2, 7, 1, 9] * 6]
    requests = [b.submit(x) for x in xs]  # queued first: the worker stages ahead, both buffers
    b.start()
    for x, req in zip(xs, requests, strict=True):
        with torch.no_grad():
            want = ref(x)
        # the GPU's convolutions may run in TF32: the CPU reference agrees within 1 %
        assert torch.allclose(req.result(60), want, rtol=0.01, atol=0.01)
    b.close(10)
    st = worker.stager.describe()
    assert st["pinned"] is True and st["buffers"] == 2 and st["rows"] == 16
    assert worker.stager.fills == len(batches) and worker.batches_ahead > 0


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_casts_on_the_device_after_one_fp32_copy(precision, tmp_path):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    path, _ = demo.write_demo_model(tmp_path)
    loaded = load(Config(model=str(path), device="cuda", precision=precision))
    ref = torch.jit.load(str(path)).eval()
    worker = Worker(loaded.predictor, "cuda:0")
    b = Batcher([worker], [1, 2, 4], 0.0, max_queue=64)
    b.start()
    x = torch.randn(3, 3, 64, 64)
    out = b.submit(x).result(60)
    b.close(10)
    assert worker.stager.describe()["dtype"] == "float32"  # the model's input dtype travels
    assert out.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(out, ref(x), rtol=0.05, atol=0.05)


@needs_graphs
def test_graph_replay_equals_the_eager_run_per_bucket(tmp_path):
    gpu, _ = _demo(tmp_path)
    pred = Predictor(gpu, CUDA, None)
    sample = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    buckets = [1, 2, 4, 8, 16, 32]
    graphs = capture(pred, sample, buckets, "auto")
    assert graphs.reason in ("", "no bucket's replay was both right and faster")
    assert sorted(int(b) for b in graphs.describe()["per_bucket"]) == buckets
    for b in buckets:
        x = torch.randn(b, 3, 64, 64, device="cuda")
        eager = pred(x)
        if graphs.has(b):
            assert differs(eager, pred.fetch(graphs.replay(x)), "outputs") == ""
        else:
            assert graphs.per_bucket[b].startswith("off: ")
    # served: the replica replays its graphs and still answers as the eager model does
    xs = [torch.randn(n, 3, 64, 64) for n in (1, 3, 8, 17, 32, 5)]
    wants = [pred(x) for x in xs]  # eager, before the worker's thread uses the model
    worker = Worker(pred, "cuda:0", graphs=graphs)
    b = Batcher([worker], buckets, 0.0, max_queue=4096)
    requests = [b.submit(x) for x in xs]
    b.start()
    for want, req in zip(wants, requests, strict=True):
        assert differs(want, req.result(60), "outputs") == ""
    b.close(10)
    assert worker.describe()["cuda_graphs"]["buckets"] == graphs.buckets


class SyncsWithTheHost(nn.Module):
    """Data-dependent control flow: `bool(tensor)` waits for the device, which a capture forbids."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if bool(y.sum() > 0):
            return y
        return -y


@needs_graphs
def test_a_model_that_cannot_be_captured_serves_eagerly_with_the_reason(start_runtime, client_for):
    rt = start_runtime(SyncsWithTheHost(), device="cuda", max_batch_size=4)
    card = client_for(rt).get_json("/v1/model")[1]
    graphs = card["replicas"][0]["pipeline"]["cuda_graphs"]
    assert graphs["enabled"] is False and graphs["buckets"] == []
    assert graphs["reason"].startswith("capture failed at batch 4: "), graphs
    status, _, doc = client_for(rt).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200 and len(doc["outputs"]) == 3


def test_cuda_graphs_off_captures_nothing(start_runtime, client_for):
    rt = start_runtime(rt_models.tiny(), device="cuda", max_batch_size=8, cuda_graphs="off")
    pipe = client_for(rt).get_json("/v1/model")[1]["replicas"][0]["pipeline"]
    assert pipe["cuda_graphs"] == {
        "enabled": False,
        "buckets": [],
        "reason": "cuda_graphs: off",
        "per_bucket": {},
        "seconds": 0.0,
    }
    assert pipe["staging"]["pinned"] is True and pipe["work_ahead"] is True
    x = [1.0, 2.0, 3.0, 4.0]
    status, _, doc = client_for(rt).predict(x)
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(torch.tensor(x)))


@needs_graphs
def test_a_lowered_cap_drops_the_graphs_above_it_and_answers_stay_right():
    pred = Predictor(rt_models.tiny().cuda().eval(), CUDA, None)
    buckets = [1, 2, 4, 8]
    graphs = capture(pred, torch.randn(2, 4), buckets, "auto")
    before = dict(graphs.per_bucket)
    worker = Worker(pred, "cuda:0", graphs=graphs)
    b = Batcher([worker], buckets, 0.0, max_queue=64)
    b.start()
    b.lower_cap(below=4)  # what a CUDA OOM at batch 4 does (Worker._out_of_memory)
    x = torch.randn(8, 4)
    out = b.submit(x).result(60)
    b.close(10)
    assert torch.allclose(out, rt_models.expected(x), atol=1e-4)
    assert b.cap == 2 and all(bucket <= 2 for bucket in graphs.buckets)
    for bucket in (4, 8):
        assert not graphs.has(bucket)
        if before[bucket].startswith("on"):
            assert graphs.per_bucket[bucket] == "off: dropped, the batch cap was lowered to 2"
