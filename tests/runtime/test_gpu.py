"""GPU-only behaviour: real fp16/bf16 autocast, the memory-sized batch cap, a real CUDA OOM.
Skipped without CUDA; `scripts/gpu_check.sh` runs them on a GPU machine."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchfleet_runtime import demo
from torchfleet_runtime.warmup import buckets_up_to

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(180),
]


class DtypeProbe(nn.Module):
    """Records the dtype a Linear produced inside the model (autocast changes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.seen.append(y.dtype)
        return y


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_reduced_precision_runs_under_autocast_on_cuda(precision, dtype, start_runtime, client_for):
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    m = DtypeProbe()
    rt = start_runtime(m, device="cuda", precision=precision, max_batch_size=2)
    status, _, doc = client_for(rt).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200 and len(doc["outputs"]) == 3
    assert set(m.seen) == {dtype}
    with torch.no_grad():
        want = m.cpu().fc(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.allclose(torch.tensor(doc["outputs"]), want, rtol=0.02, atol=0.02)


def test_demo_model_fp16_matches_fp32(start_runtime, client_for, tmp_path):
    model_path, _ = demo.write_demo_model(tmp_path)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    outs = {}
    for precision in ("fp32", "fp16"):
        rt = start_runtime(
            model=str(model_path),
            input_shape=None,
            device="cuda",
            precision=precision,
            max_batch_size=4,
        )
        status, _, doc = client_for(rt).predict(x.tolist())
        assert status == 200
        outs[precision] = torch.tensor(doc["outputs"])
    assert torch.allclose(outs["fp16"], outs["fp32"], rtol=0.02, atol=0.02)


def test_cap_is_the_largest_bucket_within_the_memory_fraction(start_runtime, tmp_path):
    model_path, _ = demo.write_demo_model(tmp_path)
    fraction = 0.02
    rt = start_runtime(
        model=str(model_path), input_shape=None, device="cuda", memory_fraction=fraction
    )
    sizing = rt.runtime.sizing
    limit = fraction * torch.cuda.mem_get_info()[1]
    assert sizing.method == "memory"
    fits = [b for b, peak in sizing.measurements.items() if peak <= limit]
    assert sizing.cap == max(fits)
    assert any(peak > limit for peak in sizing.measurements.values()), (
        "the 2 % limit was never reached"
    )
    assert rt.runtime.batcher.buckets == buckets_up_to(sizing.cap)


class Hungry(nn.Module):
    """Allocates a third of the GPU per instance once armed: batches above 2 really run out."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            per = torch.cuda.mem_get_info()[1] // 3
            block = torch.empty(int(x.shape[0]) * per, dtype=torch.uint8, device=x.device)
            del block
        return self.fc(x)


def test_a_real_cuda_oom_splits_and_lowers_the_cap(start_runtime, client_for):
    m = Hungry()
    # eager runs: a graph replays the kernels it captured, never Hungry's Python allocation
    rt = start_runtime(m, device="cuda", max_batch_size=8, cuda_graphs="off")
    m.armed = True
    x = torch.randn(8, 4)
    status, _, doc = client_for(rt).predict(x.tolist())
    assert status == 200
    with torch.no_grad():
        want = nn.functional.linear(x, m.fc.weight.cpu(), m.fc.bias.cpu())
    assert torch.allclose(torch.tensor(doc["outputs"]), want, atol=1e-4)
    assert rt.runtime.batcher.cap <= 2
