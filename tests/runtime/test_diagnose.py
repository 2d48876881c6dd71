"""`torchfleet-runtime diagnose` against a real runtime on loopback: what it reads, what it
finds, and the histogram arithmetic behind its p99."""

from __future__ import annotations

import json
import threading

import pytest
import rt_models
from rt_helpers import EDGE_WORKERS, LABELS, TWO, Client, needs_two_cpus
from rt_models import x4
from torchfleet_runtime.cli import main
from torchfleet_runtime.diagnose import findings, quantile

pytestmark = pytest.mark.timeout(120)


def test_quantile_interpolates_within_the_bucket_as_prometheus_does():
    # 100 observations: 50 up to 10 ms, 40 more up to 20 ms, 10 more up to 100 ms
    buckets = {0.01: 50.0, 0.02: 90.0, 0.1: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.7, buckets) == pytest.approx(0.015)
    assert quantile(0.99, buckets) == pytest.approx(0.092)
    assert quantile(0.99, {0.01: 0.0, float("inf"): 0.0}) is None


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["diagnose", *argv])
    return code, capsys.readouterr().out


@needs_two_cpus
def test_diagnose_reports_stages_replicas_batches_and_versions(start_runtime, capsys):
    rt = start_runtime(rt_models.tiny(), device="cpu", devices=TWO, max_batch_size=4)
    stop = threading.Event()

    def load() -> None:
        c = Client(rt.port)
        for i in range(2000):  # bounded; stops when the window is over
            if stop.is_set():
                break
            c.predict(x4(float(i % 7)))
        c.close()

    # one batch served before diagnose reads the replicas (under load its first read could
    # come before the load threads' first answer)
    assert Client(rt.port).predict(x4(1.0))[0] == 200
    threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        code, out = _run(capsys, "--url", f"http://127.0.0.1:{rt.port}", "--window", "1", "--json")
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert code == 0
    doc = json.loads(out)
    assert doc["readyz"]["status"] == 200 and doc["model"]["state"] == "ready"
    assert doc["versions"]["torch"] and doc["versions"]["runtime"]
    traffic = doc["traffic"]
    assert traffic["requests_per_s_by_code"]["200"] > 0
    # only /v1 traffic here: the route's rate is every code's
    assert list(traffic["requests_per_s_by_route"]) == ["/v1/predict"]
    assert traffic["requests_per_s_by_route"]["/v1/predict"] == pytest.approx(
        sum(traffic["requests_per_s_by_code"].values()), abs=0.05
    )
    assert doc["traffic"]["latency"]["p99_s"] > 0
    for stage in ("decode", "queue", "model", "encode", "write"):
        assert doc["stages"][stage]["count"] > 0, stage
    assert [r["device"] for r in doc["replicas"]] == list(LABELS)
    assert all(r["state"] == "serving" and r["torch_threads"] == 1 for r in doc["replicas"])
    assert sum(len(r["recent_batch_sizes"]) for r in doc["replicas"]) > 0
    assert all(0 <= r["busy_share"] <= 1 for r in doc["replicas"])
    assert doc["edges"]["workers"] == EDGE_WORKERS and doc["edges"]["restarts"] == 0

    code, text = _run(capsys, "--url", f"http://127.0.0.1:{rt.port}", "--window", "0")
    assert code == 0
    assert "by route: " in text
    assert "stage" in text and LABELS[0] in text and LABELS[1] in text and "findings:" in text
    assert f"edge processes {EDGE_WORKERS} (restarts 0" in text


@needs_two_cpus
def test_a_degraded_node_is_a_finding_that_points_at_its_runbook(start_runtime, capsys):
    m = rt_models.PerReplica()
    m.fail_on = {LABELS[1]: "broken on this replica"}
    rt = start_runtime(m, device="cpu", devices=TWO, max_batch_size=2)
    code, out = _run(capsys, "--url", f"http://127.0.0.1:{rt.port}", "--window", "0", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["replicas"][1]["state"] == "failed"
    assert any(
        f"replica {LABELS[1]} failed" in f and "docs/runbooks.md#torchfleetreplicadown" in f
        for f in doc["findings"]
    ), doc["findings"]


def test_memory_findings_use_the_alert_thresholds():
    replica = {
        "device": "cuda:0",
        "memory": {
            "fragmentation": 0.42,
            "reserved_share": 0.81,
            "ooms": 0,
            "alloc_retries": 3,
        },
        "memory_growth": {"alloc_retries": 2.0, "ooms": 0.0},
        "memory_fraction": 0.7,
    }
    doc = {"readyz": {"status": 200, "body": {}}, "replicas": [replica], "stages": {}}
    found = findings(doc)
    assert any("2 allocator retries" in f and "#torchfleetgpuallocretries" in f for f in found)
    assert any("fragmentation 0.42" in f and "#torchfleetgpumemoryfragmented" in f for f in found)
    assert any("reserved 0.81" in f and "#torchfleetgpumemoryabovesizing" in f for f in found)
    replica["memory"].update(fragmentation=0.1, reserved_share=0.72)
    replica["memory_growth"]["alloc_retries"] = 0.0
    assert findings(doc) == []


def test_nothing_answering_is_exit_1(capsys):
    from torchfleet_bench.local import free_port

    code = main(["diagnose", "--url", f"http://127.0.0.1:{free_port()}", "--window", "0"])
    assert code == 1 and "no runtime answers" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_diagnose_reads_the_token_file_and_tls_from_the_node_config(
    start_runtime, tmp_path, capsys
):
    """A converged node's shape: the token only in api_token_file, HTTPS with a certificate
    whose names are not the loopback address. diagnose, given only the config file, gets in:
    the model card answers 200 and the version block is full."""
    import trustme
    import yaml

    ca = trustme.CA()
    cert = ca.issue_cert("node-7.fleet.example")  # not 127.0.0.1: the pin, not the name
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    (tmp_path / "api-tokens").write_text("# current\ndiagnose-test-token-0001\n")
    settings = {
        "host": "127.0.0.1",
        "api_token_file": str(tmp_path / "api-tokens"),
        "tls_cert_file": str(tmp_path / "cert.pem"),
        "tls_key_file": str(tmp_path / "key.pem"),
    }
    rt = start_runtime(rt_models.tiny(), **settings)
    config = tmp_path / "runtime.yml"
    config.write_text(yaml.safe_dump({**settings, "port": rt.port}))

    code, out = _run(capsys, "--config", str(config), "--window", "0", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["url"] == f"https://127.0.0.1:{rt.port}"
    assert doc["v1_model"] == {"status": 200, "access": "bearer token required"}
    assert doc["model"]["model_version"] and doc["versions"]["runtime"]

    # without the token the same node answers 401 and the version block is empty
    (tmp_path / "other").write_text("not-the-token-of-node\n")
    config.write_text(
        yaml.safe_dump({**settings, "port": rt.port, "api_token_file": str(tmp_path / "other")})
    )
    code, out = _run(capsys, "--config", str(config), "--window", "0", "--json")
    doc = json.loads(out)
    assert doc["v1_model"]["status"] == 401 and doc["model"]["model_version"] is None


def test_diagnose_trusts_only_the_node_s_own_certificate(start_runtime, tmp_path, capsys):
    import trustme
    import yaml

    served, other = trustme.CA().issue_cert("node"), trustme.CA().issue_cert("node")
    served.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    served.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    other.cert_chain_pems[0].write_to_path(str(tmp_path / "other.pem"))
    rt = start_runtime(
        rt_models.tiny(),
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=str(tmp_path / "key.pem"),
    )
    config = tmp_path / "runtime.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "port": rt.port,
                "tls_cert_file": str(tmp_path / "other.pem"),  # a stranger's certificate
                "tls_key_file": str(tmp_path / "key.pem"),
            }
        )
    )
    code = main(["diagnose", "--config", str(config), "--window", "0"])
    assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
