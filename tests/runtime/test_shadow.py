"""Shadow testing over real loopback HTTP with real torch: a candidate beside the serving model
sees a sampled share of live requests off the answer's path. A candidate that raises, hangs or
is slow never changes a live answer (every answer is checked against the serving model's exact
output); one whose outputs differ is found and measured. The live path's latency with the shadow
on and off is measured by a benchmark (benchmarks/shadow_overhead.sh), not here."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import rt_models
import torch
from rt_helpers import Client, metric_value
from torchfleet_runtime.config import ConfigError, load_config
from torchfleet_runtime.shadow import compare

pytestmark = pytest.mark.timeout(120)

REQUESTS = 40  # per test, from CLIENTS threads
CLIENTS = 4


def _inputs(i: int) -> list[float]:
    # spread values so the classes' order depends on the input (argmax is meaningful)
    return [float(i % 7) - 3.0, float(i % 5) - 2.0, 1.0, -float(i % 3)]


def _wait_shadow(svc: Any, state: str = "ready", timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        summary = svc.runtime.status(detail=True)["model"]["shadow"]
        if summary["state"] == state:
            return summary
        time.sleep(0.05)
    raise AssertionError(f"the shadow never became {state}: {summary}")


def _settled(client: Client, total: int, timeout_s: float = 60) -> dict[str, Any]:
    """The shadow summary of GET /v1/model once every sampled request has a result."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, card = client.get_json("/v1/model")
        assert status == 200
        shadow = card["shadow"]
        if sum(shadow["requests"].values()) >= total or time.monotonic() > deadline:
            return shadow
        time.sleep(0.05)


def _live_load(port: int) -> list[tuple[int, str, list[float], list[list[float]]]]:
    """REQUESTS predictions from CLIENTS keep-alive clients: (status, version, input, outputs)."""
    out: list[tuple[int, str, list[float], list[list[float]]]] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        c = Client(port)
        try:
            for i in range(k, REQUESTS, CLIENTS):
                x = _inputs(i)
                status, headers, doc = c.predict([x])
                with lock:
                    out.append((status, headers.get("X-Model-Version", ""), x, doc.get("outputs")))
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return out


def _assert_live_answers_exact(results: list[Any]) -> None:
    assert len(results) == REQUESTS
    for status, version, x, outputs in results:
        assert status == 200, (status, outputs)
        assert version == "module"  # the serving model answered, never the candidate
        want = rt_models.expected(torch.tensor([x]))
        # Within a few float32 ulps, not bit for bit: the dynamic batcher runs this row inside
        # a batch, and the CPU's matmul kernel may sum a batch's rows in another order than one
        # row alone (seen on an AVX-512 machine). Any candidate's answer is off by whole units.
        torch.testing.assert_close(torch.tensor(outputs), want, rtol=1e-6, atol=1e-6)


def test_a_differing_candidate_is_found_and_no_client_sees_its_outputs(
    tmp_path, start_runtime, client_for
):
    path = tmp_path / "candidate.pt"
    torch.jit.script(rt_models.Flipped()).save(str(path))
    path.with_suffix(".json").write_text(json.dumps({"input_shape": [4], "version": "cand-2"}))
    svc = start_runtime(rt_models.tiny(), shadow_model=str(path), shadow_sample=1.0)
    _wait_shadow(svc)
    results = _live_load(svc.port)
    _assert_live_answers_exact(results)
    c = client_for(svc)
    shadow = _settled(c, REQUESTS)
    assert shadow["model_version"] == "cand-2"
    counts = shadow["requests"]
    assert counts["error"] == counts["mismatch"] == 0
    assert counts["compared"] + counts["dropped_load"] + counts["dropped_busy"] == REQUESTS
    assert counts["compared"] > 0
    assert shadow["argmax_agreement"] < 0.5  # flipped classes: the argmax moves on most inputs
    assert shadow["max_abs_diff"] > 0.1
    assert set(shadow["model_seconds"]) == {"live", "candidate"}
    _, _, body = c.call("GET", "/metrics")
    text = body.decode()
    v = 'model_version="cand-2"'
    compared = metric_value(text, "torchfleet_shadow_requests_total", f'{v},result="compared"')
    assert compared == counts["compared"]
    assert metric_value(text, "torchfleet_shadow_instances_total", v) == shadow["instances"]
    agree = metric_value(text, "torchfleet_shadow_argmax_agreements_total", v)
    assert agree / shadow["instances"] == pytest.approx(shadow["argmax_agreement"], abs=1e-6)


def test_an_identical_candidate_agrees_everywhere(start_runtime, client_for):
    svc = start_runtime(rt_models.tiny(), shadow_module=rt_models.tiny(), shadow_sample=1.0)
    _wait_shadow(svc)
    c = client_for(svc)
    for i in range(10):
        assert c.predict([_inputs(i)])[0] == 200
    shadow = _settled(c, 10)
    assert shadow["requests"]["compared"] == 10  # one client: the live queue never backs up
    assert shadow["argmax_agreement"] == 1.0
    assert shadow["topk_overlap"] == 1.0
    # float32 rounding only: the shadow batches its samples apart from the live batches
    assert shadow["max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("mode", ["raise", "hang", "slow"])
def test_a_raising_hanging_or_slow_candidate_never_changes_a_live_answer(
    mode, start_runtime, client_for
):
    candidate = rt_models.Misbehaving(mode)
    svc = start_runtime(
        rt_models.tiny(), shadow_module=candidate, shadow_sample=1.0, shadow_max_queue=4
    )
    _wait_shadow(svc)
    candidate.armed.set()
    try:
        results = _live_load(svc.port)
        _assert_live_answers_exact(results)
        c = client_for(svc)
        status, ready = c.get_json("/readyz")
        assert status == 200, ready
        if mode == "hang":
            # the candidate holds one batch (at most 4 instances, its cap) for good; 4 more
            # wait in its queue (shadow_max_queue) and every other sample is dropped
            shadow = _settled(c, REQUESTS - 8)
            assert shadow["requests"]["dropped_busy"] >= REQUESTS - 8, shadow["requests"]
            assert shadow["busy_s"] is not None
        else:
            shadow = _settled(c, REQUESTS)
        counts = shadow["requests"]
        assert candidate.calls > 0
        if mode == "raise":
            assert counts["error"] > 0 and counts["compared"] == 0
        if mode == "slow":
            assert counts["compared"] > 0
            m = shadow["model_seconds"]
            assert m["candidate"]["p50"] > m["live"]["p50"]
    finally:
        candidate.release.set()


def _scripted(path: Any, module: torch.nn.Module, input_shape: list[int], version: str) -> str:
    torch.jit.script(module).save(str(path))
    path.with_suffix(".json").write_text(
        json.dumps({"input_shape": input_shape, "version": version})
    )
    return str(path)


def test_a_candidate_that_cannot_take_the_requests_fails_alone(tmp_path, start_runtime, client_for):
    live = _scripted(tmp_path / "live.pt", rt_models.tiny(), [4], "v1")
    wide = torch.nn.Sequential(torch.nn.Linear(5, 3))
    cand = _scripted(tmp_path / "cand.pt", wide, [5], "v2")
    svc = start_runtime(model=live, input_shape=None, shadow_model=cand, shadow_sample=1.0)
    shadow = _wait_shadow(svc, "failed")
    assert "shadow_model" in shadow["error"] and "[5]" in shadow["error"], shadow["error"]
    c = client_for(svc)
    status, headers, _ = c.predict([_inputs(1)])
    assert (status, headers["X-Model-Version"]) == (200, "v1")


def test_a_candidate_file_that_fails_to_load_leaves_the_live_model_serving(
    tmp_path, start_runtime, client_for
):
    path = tmp_path / "candidate.pt"
    path.write_bytes(b"not a model")
    svc = start_runtime(rt_models.tiny(), shadow_model=str(path), shadow_sample=1.0)
    shadow = _wait_shadow(svc, "failed")
    assert "shadow_model" in shadow["error"] or "TorchScript" in shadow["error"]
    c = client_for(svc)
    status, _, doc = c.predict([_inputs(2)])
    assert status == 200
    assert torch.equal(torch.tensor(doc["outputs"]), rt_models.expected(torch.tensor([_inputs(2)])))
    _, _, body = c.call("GET", "/metrics")
    assert metric_value(body.decode(), "torchfleet_shadow_loads_total", 'result="failed"') == 1


def test_under_load_the_shadow_is_dropped_first(start_runtime):
    svc = start_runtime(rt_models.tiny(), shadow_module=rt_models.tiny(), shadow_sample=1.0)
    _wait_shadow(svc)
    shadow = svc.runtime._shadow
    x = torch.tensor([_inputs(3)])
    out = rt_models.expected(x)
    shadow.offer(x, out, 0.001, live_queued=8, live_cap=8)  # a full batch waits: load
    shadow.offer(x, out, 0.001, live_queued=7, live_cap=8)
    deadline = time.monotonic() + 10
    while shadow.summary()["requests"]["compared"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    counts = shadow.summary()["requests"]
    assert counts["dropped_load"] == 1
    assert counts["compared"] == 1


def test_compare_measures_difference_argmax_and_top_k():
    a = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    same = compare(a, a.clone(), 2)
    assert (same.max_abs_diff, same.argmax_agree, same.topk_overlap) == (0.0, 2, 2.0)
    b = a.clone()
    b[0, 0] = 10.0  # instance 0: argmax 3 -> 0, top-2 {3,2} -> {0,3}
    c = compare(a, b, 2)
    assert c.max_abs_diff == 10.0
    assert c.argmax_agree == 1
    assert c.topk_overlap == pytest.approx(1.5)  # one of two shared, plus two of two
    assert compare(a, a[:, :3], 2).mismatch.startswith("shape")
    assert compare((a, a), (a,), 2).mismatch
    vec = compare(torch.ones(3), torch.zeros(3), 5)  # one value per instance: no classes
    assert (vec.max_abs_diff, vec.argmax_agree) == (1.0, None)


@pytest.mark.parametrize(
    "key,raw,allowed",
    [
        ("shadow_sample", "1.5", "a number in [0, 1]"),
        ("shadow_max_queue", "0", "an integer >= 1"),
        ("shadow_top_k", "many", "an integer >= 1"),
    ],
)
def test_shadow_settings_are_validated(key, raw, allowed):
    with pytest.raises(ConfigError) as err:
        load_config(flags={key: raw}, env={}, config_file=None)
    assert key in str(err.value) and raw in str(err.value) and allowed in str(err.value)


def test_the_shadow_takes_one_torch_thread_and_leaves_the_default(start_runtime):
    """A reload's new batcher thread takes torch's default thread count at its first op: the
    shadow's one thread must not become that default."""
    before = torch.get_num_threads()
    svc = start_runtime(rt_models.tiny(), shadow_module=rt_models.tiny(), shadow_sample=1.0)
    _wait_shadow(svc)
    seen: list[int] = []

    def fresh() -> None:
        torch.ones(64, 64) @ torch.ones(64, 64)
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=fresh)
    t.start()
    t.join()
    assert seen == [before]


def test_a_shadow_path_without_a_file_is_no_shadow_until_a_reload_finds_one(
    tmp_path, start_runtime, client_for
):
    path = tmp_path / "shadow.pt"
    admin = "admin-token-abcdefghijkl"
    svc = start_runtime(
        rt_models.tiny(), shadow_model=str(path), shadow_sample=1.0, admin_token=admin
    )
    c = client_for(svc)
    assert c.get_json("/v1/model")[1]["shadow"] is None
    torch.jit.script(rt_models.Flipped()).save(str(path))
    path.with_suffix(".json").write_text(json.dumps({"input_shape": [4], "version": "cand-3"}))
    status, _, body = c.call("POST", "/admin/reload", b"", {"Authorization": f"Bearer {admin}"})
    assert status == 200, body
    assert _wait_shadow(svc)["model_version"] == "cand-3"
    path.unlink()
    assert c.call("POST", "/admin/reload", b"", {"Authorization": f"Bearer {admin}"})[0] == 200
    assert c.get_json("/v1/model")[1]["shadow"] is None
