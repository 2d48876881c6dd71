"""Model updates without downtime: POST /admin/reload (and SIGHUP, in test_lifecycle) load the new
file beside the old, warm it, swap atomically; /readyz stays 200, no request is lost, a broken
file leaves the old model serving and says why (answer, log, metric)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import rt_models
import torch
from rt_helpers import ADMIN, AUTH, Client, metric_value
from rt_models import tiny_version

pytestmark = pytest.mark.timeout(120)


def write_model(path: Path, bias_shift: float, version: str | None) -> None:
    """Write the model and its sidecar the way a deploy should: new name, then rename."""
    tmp = path.with_suffix(".tmp")
    torch.jit.script(tiny_version(bias_shift)).save(str(tmp))
    os.replace(tmp, path)
    meta = {"input_shape": [4], "dtype": "float32", "name": "tiny"}
    if version is not None:
        meta["version"] = version
    path.with_suffix(".json").write_text(json.dumps(meta))


@pytest.fixture
def served_file(tmp_path, start_runtime):
    path = tmp_path / "model.pt"
    write_model(path, 0.0, "v1")
    svc = start_runtime(
        model=str(path), input_shape=None, max_batch_size=4, admin_token=ADMIN, log_level="info"
    )
    return svc, path


def expected(x: torch.Tensor, shift: float) -> torch.Tensor:
    with torch.no_grad():
        return tiny_version(shift)(x)


def test_reload_under_load_loses_no_request_and_keeps_readyz_200(served_file):
    svc, path = served_file
    assert svc.runtime.version == "v1"
    stop = threading.Event()
    results: list[list[tuple[int, str, list[float]]]] = [[] for _ in range(4)]
    readyz: list[int] = []
    x = [0.5, -1.0, 2.0, 3.0]

    def client(out: list[tuple[int, str, list[float]]]) -> None:
        c = Client(svc.port)
        while not stop.is_set():
            status, headers, doc = c.predict(x)
            out.append((status, headers.get("X-Model-Version", ""), doc.get("outputs")))

    def probe() -> None:
        c = Client(svc.port)
        while not stop.is_set():
            readyz.append(c.call("GET", "/readyz")[0])
            time.sleep(0.005)

    threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in results]
    threads.append(threading.Thread(target=probe, daemon=True))
    for t in threads:
        t.start()
    time.sleep(0.3)
    write_model(path, 1.0, "v2")
    status, _, data = Client(svc.port).call("POST", "/admin/reload", headers=AUTH)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(30)
    assert status == 200, data
    answer = json.loads(data)
    assert (
        answer["result"] == "ok"
        and answer["model_version"] == "v2"
        and answer["previous_version"] == "v1"
    )
    assert readyz and set(readyz) == {200}  # ready throughout
    want = {"v1": expected(torch.tensor([x]), 0.0)[0], "v2": expected(torch.tensor([x]), 1.0)[0]}
    for out in results:
        assert out and all(status == 200 for status, _, _ in out)  # not one request lost
        versions = [v for _, v, _ in out]
        assert versions == sorted(versions)  # v1 ... v1 v2 ... v2: the swap is atomic per client
        for _, version, outputs in out:
            assert torch.allclose(
                torch.tensor(outputs), want[version], atol=1e-5
            )  # each answer from its version
    assert any(v == "v2" for out in results for _, v, _ in out)
    c = Client(svc.port)
    assert c.get_json("/v1/model")[1]["model_version"] == "v2"
    text = c.call("GET", "/metrics")[2].decode()
    assert metric_value(text, "torchfleet_reloads_total", 'result="ok"') == 1
    assert 'model_version="v2"' in text and 'model_version="v1"' not in text  # one info series


def test_a_broken_model_keeps_the_old_one_serving_and_says_why(served_file, caplog):
    svc, path = served_file
    path.write_bytes(b"this is not a TorchScript archive")
    c = Client(svc.port)
    status, _, data = c.call("POST", "/admin/reload", headers=AUTH)
    assert status == 422
    err = json.loads(data)["error"]
    assert (
        err["type"] == "reload_failed"
        and "not a TorchScript archive" in err["message"]
        and "v1" in err["message"]
    )
    assert c.call("GET", "/readyz")[0] == 200
    status, headers, _ = c.predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200 and headers["X-Model-Version"] == "v1"
    info = c.get_json("/v1/model")[1]
    assert info["model_version"] == "v1" and info["reloads"]["failed"] == 1
    assert "not a TorchScript archive" in info["reloads"]["last"]["error"]
    text = c.call("GET", "/metrics")[2].decode()
    assert metric_value(text, "torchfleet_reloads_total", 'result="failed"') == 1
    assert metric_value(text, "torchfleet_reloads_total", 'result="ok"') == 0
    assert any(r.levelname == "ERROR" and "reload failed" in r.getMessage() for r in caplog.records)


def test_without_a_version_in_the_sidecar_the_version_is_the_files_sha256(served_file):
    svc, path = served_file
    write_model(path, 2.0, None)
    status, _, data = Client(svc.port).call("POST", "/admin/reload", headers=AUTH)
    assert status == 200
    import hashlib

    want = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    assert json.loads(data)["model_version"] == want == svc.runtime.version


def test_reload_needs_the_admin_token(served_file):
    svc, _ = served_file
    c = Client(svc.port)
    status, headers, _ = c.call("POST", "/admin/reload")
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="torchfleet-admin"'
    assert (
        c.call("POST", "/admin/reload", headers={"Authorization": "Bearer " + "x" * 24})[0] == 401
    )
    assert c.call("GET", "/admin/reload", headers=AUTH)[0] == 405


def test_a_reload_that_changes_the_batch_cap_says_so(tmp_path, start_runtime, caplog):
    """The cap sized by the latency budget (no max_batch_size): a model that costs more per
    instance fits fewer in the budget. The reload logs the change and /v1/model and /metrics
    carry the cap and the instances/s it sustains (a rollout's capacity guard reads them)."""
    path = tmp_path / "model.pt"
    torch.save(rt_models.switchable("good").state_dict(), path)
    svc = start_runtime(
        model=str(path),
        model_format="eager",
        factory="rt_models:switchable",
        admin_token=ADMIN,
        log_level="info",
    )
    c = Client(svc.port)
    before = c.get_json("/v1/model")[1]
    cap = before["max_batch_size"]  # Tiny's: sized on this machine, a power of two
    assert cap >= 8 and before["batch_cap_method"] == "latency", before
    # a quarter of the cap takes 80 ms of the 100 ms budget, half of it 160 ms
    torch.save(rt_models.switchable("good", item_s=0.08 / (cap // 4)).state_dict(), path)
    status, _, data = c.call("POST", "/admin/reload", headers=AUTH)
    assert status == 200, data
    assert json.loads(data)["batch_cap"] == {"before": cap, "after": cap // 4}
    after = c.get_json("/v1/model")[1]
    assert after["max_batch_size"] == cap // 4
    assert after["reloads"]["last"]["batch_cap"] == {"before": cap, "after": cap // 4}
    # the quarter cap in 80 ms and a little (the sleep's overshoot)
    assert (cap // 4) / 0.1 < after["capacity_items_per_s"] <= (cap // 4) / 0.08, after
    assert after["capacity_items_per_s"] < 0.25 * before["capacity_items_per_s"], (before, after)
    text = c.call("GET", "/metrics")[2].decode()
    assert metric_value(text, "torchfleet_max_batch_size") == cap // 4
    assert metric_value(text, "torchfleet_capacity_items_per_second") == pytest.approx(
        after["capacity_items_per_s"], abs=0.1
    )
    changed = [r for r in caplog.records if "the batch cap changed" in r.getMessage()]
    assert changed and changed[0].levelname == "WARNING", [r.getMessage() for r in caplog.records]
    assert f"from {cap} to {cap // 4}" in changed[0].getMessage()
