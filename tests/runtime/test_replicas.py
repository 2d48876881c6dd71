"""One model replica per device, fed by one queue: on CPU, replicas pinned to disjoint CPU sets
(devices: [a, b]) run the same mechanism a multi-GPU node runs, for real, on this machine.

Held here: both replicas serve, each on its own CPU with one torch thread; a request never waits
for a busy replica while another is idle; /readyz needs every replica warm; a replica that fails
(at start-up, or later: a lost device) leaves the node degraded and says so, never silently
smaller; drain, reload and a spot notice cover every replica; metrics carry the device."""

from __future__ import annotations

import threading
import time

import pytest
import rt_models
import torch
from rt_helpers import (
    ADMIN,
    AUTH,
    LABELS,
    MASK,
    TWO,
    A,
    B,
    Client,
    in_thread,
    metric_value,
    needs_two_cpus,
    notice_for,
    wait_until,
)
from rt_models import GATED, tiny_version, x4
from torchfleet_compat.problems import sentence
from torchfleet_runtime.config import ConfigError, load_config
from torchfleet_runtime.placement import replica_places

pytestmark = pytest.mark.timeout(120)

# How long an idle replica may take to pick up a queued request while the other is busy: a
# thread's wake-up on a loaded 2-CPU machine, with margin. The batcher's own bound is the
# wake-up itself (batch_wait: arrivals) plus max_delay_ms with batch_wait: always.
IDLE_PICKUP_BOUND_S = 2.0


# --- the setting ------------------------------------------------------------------------------


def test_devices_parse_from_yaml_env_and_flags_and_bad_values_name_key_value_and_allowed():
    cfg, _ = load_config(env={"TORCHFLEET_DEVICES": "0-1,2-3"}, config_file=None)
    assert cfg.devices == ((0, 1), (2, 3))
    cfg, _ = load_config(flags={"devices": "all"}, env={}, config_file=None)
    assert cfg.devices == "all"
    with pytest.raises(ConfigError) as err:
        load_config(env={"TORCHFLEET_DEVICES": "0,1,1"}, config_file=None)
    assert "env TORCHFLEET_DEVICES: devices = '0,1,1' is invalid (device 1 is in two" in str(
        err.value
    )
    assert "allowed: auto, all, or a list of replicas" in str(err.value)


def test_placement_on_cpu_auto_all_and_sets():
    from torchfleet_runtime.config import Config

    def labels(devices, threads=None):
        cfg = Config(device="cpu", devices=devices, torch_threads=threads)
        return [(p.label, p.cpus, p.threads) for p in replica_places(cfg, cpus=[0, 1, 2, 3])]

    assert labels("auto") == [("cpu", None, None)]  # the single-replica path, unpinned
    assert [lbl for lbl, *_ in labels("all")] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"][: len(MASK)]
    assert labels(((0, 1), (2, 3))) == [("cpu:0-1", (0, 1), 2), ("cpu:2-3", (2, 3), 2)]
    assert labels(((0,), (3,)), threads=2) == [("cpu:0", (0,), 2), ("cpu:3", (3,), 2)]
    with pytest.raises(ConfigError) as err:
        replica_places(Config(device="cpu", devices=((0,), (7,))), cpus=[0, 1, 2, 3])
    assert str(err.value).startswith(
        sentence("devices", [0, 7], "", why="CPU 7 is not one of them").split("; allowed")[0]
    )
    assert "CPU sets within this process's CPUs 0,1,2,3" in str(err.value)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_gpu_replicas_without_cuda_are_refused_naming_the_device():
    from torchfleet_runtime.config import Config

    with pytest.raises(ConfigError, match="device = 'cuda' is invalid .*CUDA is not available"):
        replica_places(Config(device="cuda", devices=((0,), (1,))))


# --- serving ---------------------------------------------------------------------------------


@needs_two_cpus
def test_two_pinned_replicas_both_serve_and_an_idle_one_never_waits_for_a_busy_one(
    start_runtime, client_for
):
    m = rt_models.PerReplica()
    rt = start_runtime(m, device="cpu", devices=TWO, max_batch_size=4)
    card = client_for(rt).get_json("/v1/model")[1]
    assert [(r["device"], r["cpus"], r["torch_threads"], r["state"]) for r in card["replicas"]] == [
        (LABELS[0], [A], 1, "serving"),
        (LABELS[1], [B], 1, "serving"),
    ]
    # every call each replica made (warm-up included) ran on its own CPU with one torch thread
    assert m.threads_of(LABELS[0]) == {(frozenset({A}), 1)}
    assert m.threads_of(LABELS[1]) == {(frozenset({B}), 1)}

    busy, busy_out = in_thread(lambda: client_for(rt).predict(GATED))
    wait_until(lambda: len(m.entered) == 1, "one replica to hold the gated request")
    holder = m.entered[0]
    t0 = time.monotonic()
    status, _, doc = client_for(rt).predict(x4(1.0))  # the gate is still closed
    took = time.monotonic() - t0
    assert status == 200 and not busy_out, "the second request waited for the busy replica"
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(torch.tensor(x4(1.0))))
    assert took < IDLE_PICKUP_BOUND_S, f"the idle replica took {took:.2f} s to answer"
    other = m.calls[-1][0]
    assert {lbl for lbl in LABELS if holder.endswith(lbl) or other.endswith(lbl)} == set(LABELS)
    m.gate.set()
    busy.join(20)
    assert busy_out[0][0] == 200

    text = rt.runtime.metrics_text().decode()
    for label in LABELS:
        on = f'device="{label}"'
        assert metric_value(text, "torchfleet_batch_size_count", on) >= 1
        assert metric_value(text, "torchfleet_replica_ready", on) == 1
        assert metric_value(text, "torchfleet_replica_busy_seconds_total", on) > 0
        assert metric_value(text, "torchfleet_torch_threads", on) == 1
    assert (
        metric_value(
            text, "torchfleet_stage_duration_seconds_count", f'device="{LABELS[0]}",stage="model"'
        )
        >= 1
    )
    assert (
        metric_value(text, "torchfleet_degraded") == 0
        and metric_value(text, "torchfleet_ready") == 1
    )


@needs_two_cpus
def test_readyz_waits_for_every_replica_to_warm(start_runtime, client_for):
    m = rt_models.PerReplica()
    held = threading.Event()
    # max_batch_size 2: no sizing runs, warm-up runs buckets 1 and 2 three times each, then the
    # self-test: replica B is held at its self-test while replica A has passed its own
    warm_calls = 3 * 2
    m.warm_gate = (LABELS[1], warm_calls, held)
    rt = start_runtime(m, wait=False, device="cpu", devices=TWO, max_batch_size=2)
    c = client_for(rt)
    wait_until(
        lambda: (
            len(m.threads_of(LABELS[0]))
            and sum(n.endswith(LABELS[0]) for n, *_ in m.calls) > warm_calls
        ),
        "replica A to pass its self-test",
    )
    assert c.call("GET", "/readyz")[0] == 503
    held.set()
    wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "ready once both replicas are warm")


@needs_two_cpus
def test_a_replica_that_fails_to_warm_leaves_the_node_degraded_and_reported(
    start_runtime, client_for
):
    m = rt_models.PerReplica()
    m.fail_on = {LABELS[1]: "broken on this replica"}
    rt = start_runtime(m, device="cpu", devices=TWO, max_batch_size=2)
    c = client_for(rt)
    status, _, body = c.call("GET", "/readyz")
    assert status == 503 and b'"degraded"' in body
    assert f"replica {LABELS[1]} failed (RuntimeError: broken on this replica)".encode() in body
    card = c.get_json("/v1/model")[1]
    assert card["state"] == "degraded"
    assert [(r["device"], r["state"]) for r in card["replicas"]] == [
        (LABELS[0], "serving"),
        (LABELS[1], "failed"),
    ]
    assert "broken on this replica" in card["replicas"][1]["error"]
    assert c.predict(x4(2.0))[0] == 200  # the healthy replica still answers
    text = rt.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_replica_ready", f'device="{LABELS[1]}"') == 0
    assert metric_value(text, "torchfleet_replica_ready", f'device="{LABELS[0]}"') == 1
    assert (
        metric_value(text, "torchfleet_degraded") == 1
        and metric_value(text, "torchfleet_ready") == 0
    )
    assert c.call("GET", "/livez")[0] == 200


@needs_two_cpus
def test_when_no_replica_warms_start_up_fails(start_runtime):
    m = rt_models.PerReplica()
    m.fail_on = {LABELS[0]: "broken everywhere", LABELS[1]: "broken everywhere"}
    with pytest.raises(RuntimeError, match="broken everywhere"):
        start_runtime(m, device="cpu", devices=TWO, max_batch_size=2)


@needs_two_cpus
def test_a_replica_whose_device_is_lost_leaves_and_the_other_serves_on(start_runtime, client_for):
    m = rt_models.PerReplica()
    rt = start_runtime(m, device="cpu", devices=TWO, max_batch_size=2)
    busy, busy_out = in_thread(lambda: client_for(rt).predict(GATED))
    wait_until(lambda: len(m.entered) == 1, "one replica to hold the gated request")
    other = next(lbl for lbl in LABELS if not m.entered[0].endswith(lbl))
    # the message torch raises for a sticky CUDA error; only the replica's reaction is tested
    m.fail_on = {other: "CUDA error: an illegal memory access was encountered"}
    status, headers, doc = client_for(rt).predict(x4(3.0))
    assert status == 503 and doc["error"]["type"] == "replica_failed"
    assert other in doc["error"]["message"] and headers["Retry-After"] == "1"
    m.fail_on = {}
    m.gate.set()
    busy.join(20)
    assert busy_out[0][0] == 200
    c = client_for(rt)
    wait_until(lambda: rt.runtime.state == "degraded", "the node to report itself degraded")
    status, _, body = c.call("GET", "/readyz")
    assert status == 503 and f"replica {other} failed".encode() in body
    assert all(c.predict(x4(float(i)))[0] == 200 for i in range(5))  # the survivor serves
    text = rt.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_replica_ready", f'device="{other}"') == 0
    assert c.call("GET", "/livez")[0] == 200


# --- drain, reload, spot notice ------------------------------------------------------------------


@needs_two_cpus
def test_a_drain_answers_what_every_replica_holds_then_stops_them_all(start_runtime, client_for):
    m = rt_models.PerReplica()
    rt = start_runtime(m, device="cpu", devices=TWO, max_batch_size=1)
    held = [in_thread(lambda: client_for(rt).predict(GATED)) for _ in range(2)]
    wait_until(lambda: len(m.entered) == 2, "both replicas to hold a gated request")
    assert {lbl for lbl in LABELS for n in m.entered if n.endswith(lbl)} == set(LABELS)
    rt.runtime.request_stop("test")
    c = client_for(rt)
    # edge processes take the new state from the owner's push a moment later (request_stop is
    # signal-safe: it sends, it does not wait for their acknowledgements)
    wait_until(lambda: c.call("GET", "/readyz")[0] == 503, "/readyz to answer 503 while draining")
    assert c.predict(x4(1.0))[0] == 503
    assert not rt.runtime.drain(0.2)  # both still running
    m.gate.set()
    assert rt.runtime.drain(10)
    for t, _ in held:
        t.join(10)
    assert [out[0][0] for _, out in held] == [200, 200]
    rt.runtime.close(10)
    assert not rt.runtime.batcher.is_alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("torchfleet-batcher-")]


@needs_two_cpus
def test_a_spot_notice_drains_every_replica(metadata_server, start_runtime, client_for):
    srv, url = metadata_server
    m = rt_models.PerReplica()
    rt = start_runtime(
        m,
        device="cpu",
        devices=TWO,
        max_batch_size=1,
        spot_watch="aws",
        aws_metadata_url=url,
        spot_poll_interval_s=0.02,
    )
    held = [in_thread(lambda: client_for(rt).predict(GATED)) for _ in range(2)]
    wait_until(lambda: len(m.entered) == 2, "both replicas to hold a gated request")
    srv.notice["aws"] = notice_for("aws")
    assert rt.runtime.stop_requested.wait(20) and rt.runtime.state == "draining"
    m.gate.set()
    assert rt.runtime.drain(10)
    for t, _ in held:
        t.join(10)
    assert [out[0][0] for _, out in held] == [200, 200]


@needs_two_cpus
def test_a_reload_brings_the_new_model_to_every_replica(
    tmp_path, start_runtime, client_for, monkeypatch
):
    gate = tmp_path / "gate"
    monkeypatch.setenv("RT_GATE_FILE", str(gate))
    path = tmp_path / "weights.pt"
    torch.save(tiny_version(0.0).state_dict(), path)
    rt = start_runtime(
        model=str(path),
        model_format="eager",
        factory="rt_models:file_gated",
        device="cpu",
        devices=TWO,
        max_batch_size=1,
        admin_token=ADMIN,
    )
    c = client_for(rt)
    torch.save(tiny_version(10.0).state_dict(), path)
    status, _, body = c.call("POST", "/admin/reload", b"", AUTH)
    assert status == 200, body
    gated, gated_out = in_thread(lambda: client_for(rt).predict(GATED))
    wait_until(
        lambda: (
            metric_value(rt.runtime.metrics_text().decode(), "torchfleet_queue_depth") == 0
            and rt.runtime.batcher.busy_since is not None
        ),
        "one replica to hold the gated request",
    )
    status, _, doc = c.predict(x4(1.0))  # the other replica, while the first is held
    assert status == 200
    want = tiny_version(10.0)(torch.tensor([x4(1.0)]))[0]
    assert torch.allclose(torch.tensor(doc["outputs"]), want.detach())
    gate.touch()
    gated.join(20)
    status, _, doc = gated_out[0]
    assert status == 200
    want = tiny_version(10.0)(torch.tensor([GATED]))[0]
    assert torch.allclose(torch.tensor(doc["outputs"]), want.detach())
    card = c.get_json("/v1/model")[1]
    assert card["reloads"]["ok"] == 1 and {r["state"] for r in card["replicas"]} == {"serving"}
    text = rt.runtime.metrics_text().decode()
    # both answers came from the new slot's workers, one per replica
    assert all(
        metric_value(text, "torchfleet_batch_size_count", f'device="{lbl}"') >= 1 for lbl in LABELS
    )
    assert Client(rt.port).call("GET", "/readyz")[0] == 200
