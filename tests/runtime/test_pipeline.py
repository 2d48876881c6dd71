"""The batch pipeline on CPU (staging.py, worker.py's work-ahead, graphs.py's CPU verdict): a
reused staging buffer never hands one batch another batch's rows, padding is zeros and never
reaches an answer, answers never alias the buffer, and the batcher lends a working-ahead
worker only a batch that should run now. The GPU side is test_gpu_pipeline.py."""

from __future__ import annotations

import threading

import pytest
import rt_models
import torch
from torch import nn
from torchfleet_compat.runtime_settings import parse_value
from torchfleet_runtime import staging
from torchfleet_runtime.batcher import Batcher, BatchInfo
from torchfleet_runtime.config import ConfigError, load_config
from torchfleet_runtime.graphs import capture
from torchfleet_runtime.model import Predictor
from torchfleet_runtime.staging import Stager
from torchfleet_runtime.worker import ReplicaLost, Worker

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


class Echo(nn.Module):
    """Answers each row with the row itself (a view of its input, as an identity layer would)
    and records a copy of every batch it ran, padding included."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return x


def _rows(value: float, n: int) -> torch.Tensor:
    return torch.full((n, 4), value)


def test_reused_staging_buffers_never_mix_batches_and_padding_never_leaks():
    m = Echo()
    worker = Worker(Predictor(m, CPU, None), "cpu", ahead=True)  # two buffers, used in turn
    b = Batcher([worker], [1, 2, 4, 8], 0.0, max_queue=1024)
    batches: list[BatchInfo] = []
    b.on_batch.append(batches.append)
    # Distinct values per request, sizes that need padding; all queued before the worker starts
    # so it forms every batch while holding the previous one (work-ahead) and reuses both buffers.
    sizes = [1, 2, 3, 1, 5, 2, 7, 3, 1, 6, 2, 1, 3, 3, 4, 1] * 4
    requests = [(i + 1.0, b.submit(_rows(i + 1.0, n))) for i, n in enumerate(sizes)]
    b.start()
    # Answers are read only after every batch ran: an answer that aliased a staging buffer
    # would by now hold rows of a later batch.
    for value, req in requests:
        out = req.result(30)
        assert torch.equal(out, torch.full_like(out, value)), f"request {value} got {out}"
    b.close(10)
    assert worker.stager.fills + worker.stager.passed == len(batches)
    assert worker.stager.fills > 2 * worker.stager.count
    assert worker.batches_ahead > 0
    assert sum(i.size for i in batches) == sum(sizes)
    assert len(m.seen) == len(batches)
    for info, seen in zip(batches, m.seen, strict=True):
        assert seen.shape[0] == info.bucket
        assert torch.count_nonzero(seen[info.size :]) == 0, "padding rows must be zeros"
        assert torch.all(seen[: info.size] != 0), "real rows must be the batch's own"


def test_one_chunk_at_its_bucket_runs_from_the_request_without_a_copy():
    m = rt_models.tiny()
    worker = Worker(Predictor(m, CPU, None), "cpu")
    b = Batcher([worker], [1, 2, 4], 0.0, max_queue=64)
    b.start()
    x = torch.randn(4, 4)
    assert torch.allclose(b.submit(x).result(30), rt_models.expected(x), atol=1e-6)
    y = torch.randn(3, 4)  # padded to 4: gathered into the buffer
    assert torch.allclose(b.submit(y).result(30), rt_models.expected(y), atol=1e-6)
    b.close(10)
    assert (worker.stager.passed, worker.stager.fills) == (1, 1)
    assert worker.stager.describe()["pinned"] is False


def test_an_answer_never_aliases_the_request_memory_its_sender_reuses():
    worker = Worker(Predictor(Echo(), CPU, None), "cpu")
    b = Batcher([worker], [1, 2, 4], 0.0, max_queue=64)
    b.start()
    x = _rows(5.0, 4)  # one chunk at its bucket: the model reads the request's own tensor
    out = b.submit(x).result(30)
    x.fill_(-1.0)  # the sender reuses its memory once answered (a shared-memory slot)
    b.close(10)
    assert worker.stager.passed == 1
    assert torch.equal(out, _rows(5.0, 4))


def test_a_cpu_stager_keeps_one_buffer_at_the_cap_and_reuses_it():
    st = Stager(CPU)
    a = st.stage([_rows(1.0, 2), _rows(2.0, 1)], 4, 8)
    first_buffer = a.host.data_ptr()
    assert a.host.shape[0] == 4 and a.n == 3 and st.rows == 8
    assert a.host[:, 0].tolist() == [1.0, 1.0, 2.0, 0.0]
    c = st.stage([_rows(3.0, 1)], 2, 8)
    assert c.host.data_ptr() == first_buffer  # the same memory, refilled
    assert c.host[:, 0].tolist() == [3.0, 0.0]


def test_a_working_ahead_worker_takes_only_a_batch_that_should_run_now():
    clock = [0.0]
    w = Worker(Predictor(rt_models.tiny(), CPU, None), "cpu", ahead=True)
    b = Batcher([w], [1, 2, 4], max_delay_s=0.01, max_queue=64, clock=lambda: clock[0])
    assert b.next_batch(w, wait=False) is None  # empty queue: nothing, at once
    b.submit(torch.zeros(1, 4))
    assert b.next_batch(w, wait=False) is None  # it would wait for company until the deadline
    clock[0] = 0.02
    chunks, reason = b.next_batch(w, wait=False)
    assert reason == "deadline" and len(chunks) == 1
    b.submit(torch.zeros(4, 4))
    chunks, reason = b.next_batch(w, wait=False)
    assert reason == "full" and len(w.running) == 2 and w.running[1] is chunks[0]
    b.give_back(w, chunks)  # a lost replica's ahead batch returns to the head of the queue
    assert b.queued == 4 and len(w.running) == 1


class LostAtTheWait(Predictor):
    """The tiny model whose outputs' wait raises, once armed, the error torch gives for a sticky
    CUDA fault (on a GPU it surfaces when the host waits for the batch); only the worker's
    reaction is tested, as in test_replicas.py."""

    def __init__(self) -> None:
        super().__init__(rt_models.tiny(), CPU, None)
        self.armed = True

    def fetch(self, out):
        if self.armed:
            self.armed = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().fetch(out)


def test_a_batch_staged_ahead_by_a_lost_replica_is_served_by_another():
    lost = Worker(LostAtTheWait(), "a", ahead=True)
    other = Worker(Predictor(rt_models.tiny(), CPU, None), "b")
    b = Batcher([lost, other], [1, 2], 0.0, max_queue=64)
    xs = [torch.full((1, 4), float(i)) for i in range(6)]
    requests = [b.submit(x) for x in xs]
    first = threading.Thread(target=b.serve_here, args=(0,), daemon=True)
    first.start()  # alone: it takes a batch, stages the next ahead, then loses its device
    first.join(30)
    assert lost.lost and lost.batches_ahead == 1 and lost.running == []
    assert b.queued == 4  # the batch staged ahead went back to the head of the queue
    second = threading.Thread(target=b.serve_here, args=(1,), daemon=True)
    second.start()
    for i, (x, req) in enumerate(zip(xs, requests, strict=True)):
        if i < 2:  # the batch that was running when the device failed
            with pytest.raises(ReplicaLost, match="replica a failed"):
                req.result(30)
        else:
            assert torch.allclose(req.result(30), rt_models.expected(x), atol=1e-6)
    b.close(10)


def test_cpu_replicas_capture_no_graphs_and_say_why(start_runtime, client_for):
    pred = Predictor(rt_models.tiny(), CPU, None)
    assert capture(pred, torch.zeros(1, 4), [1, 2], "auto").reason == (
        "device cpu (CUDA graphs need a CUDA replica)"
    )
    assert capture(pred, torch.zeros(1, 4), [1, 2], "off").reason == "cuda_graphs: off"
    rt = start_runtime(rt_models.tiny(), max_batch_size=4)
    x = torch.randn(3, 4)  # padded to 4: gathered into the buffer, allocated at the cap
    status, _, doc = client_for(rt).predict(x.tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x), atol=1e-5)
    card = client_for(rt).get_json("/v1/model")[1]
    pipe = card["replicas"][0]["pipeline"]
    assert pipe["cuda_graphs"]["enabled"] is False
    assert pipe["cuda_graphs"]["reason"].startswith("device cpu")
    assert pipe["work_ahead"] is False
    assert pipe["staging"]["pinned"] is False and pipe["staging"]["rows"] == 4
    assert pipe["staging"]["self_check"].endswith("x the plain assembly at batch 4")


def test_staging_measured_slower_at_start_up_is_turned_off_and_answers_stay_right(
    monkeypatch, start_runtime, client_for
):
    monkeypatch.setattr(staging, "SLOWER", 0.0)  # any timing is "slower"
    rt = start_runtime(rt_models.tiny(), max_batch_size=8)
    x = torch.randn(5, 4)  # padded to 8: the plain way, cat and pad
    status, _, doc = client_for(rt).predict(x.tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x), atol=1e-5)
    st = client_for(rt).get_json("/v1/model")[1]["replicas"][0]["pipeline"]["staging"]
    assert st["off_reason"].endswith("(slower: cat and pad instead)")
    assert st["off_reason"].startswith("staging ") and "at batch 8" in st["off_reason"]
    assert st["batches_gathered"] == 0


def test_cuda_graphs_setting_is_validated_with_the_allowed_values():
    assert parse_value("cuda_graphs", "off") == "off"
    assert load_config(env={})[0].cuda_graphs == "auto"
    with pytest.raises(
        ConfigError, match=r"cuda_graphs = 'on' is invalid.*allowed: one of auto, off"
    ):
        load_config(env={"TORCHFLEET_CUDA_GRAPHS": "on"})
