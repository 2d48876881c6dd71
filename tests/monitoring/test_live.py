"""Proof on real processes (tests/monitoring/live_stack.py): Debian's Prometheus, configured by
the role's filter plugin and loaded with the role's rules, scrapes a real `torchfleet-runtime
serve` and node exporter on loopback under a short bounded load; every target of every panel
of the dashboard the generator builds returns data from Prometheus' HTTP API; then the
runtime is stopped and TorchfleetNodeNotReady fires in Prometheus and reaches the webhook
through Alertmanager.

GPU panels read the node exporter's textfile written by roles/gpu_monitoring's real exporter
from an nvidia-smi line in the recorded CSV format (no GPU here). Until the runtime exports the
new metric contract (per-stage histograms, model info), the panels that need it are reported
as expected failures; once it exports any of it, every panel must return data.

TORCHFLEET_RUNTIME_BIN picks another runtime's executable (default: this venv's);
TORCHFLEET_LIVE_LOAD_S lengthens the load and TORCHFLEET_DASHBOARD_PNG saves the rendered
dashboard there (how the picture in docs/monitoring.md is made)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from live_stack import NODE_NAME, STACK, LiveStack, wait_for
from monitoring_support import RULE_FILES

from roles.monitoring.generator import dashboard, render

# Metrics the runtime gains with the metric contract of issue 10.
NEW_CONTRACT = (
    "torchfleet_stage_duration_seconds",
    "torchfleet_model_info",
    "torchfleet_spot_interruption_notice",
    "torchfleet_reloads_total",
)
# Exported for CUDA replicas only (runtime/src/torchfleet_runtime/gpu_metrics.py).
CUDA_ONLY = ("torchfleet_cuda_", "torchfleet_memory_fraction")
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def _recorded() -> dict[str, set[str]]:
    """Each recording rule's name -> the names its expression reads."""
    out: dict[str, set[str]] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    out.setdefault(rule["record"], set()).update(NAME.findall(rule["expr"]))
    return out


def raw_metrics(expr: str, recorded: dict[str, set[str]]) -> set[str]:
    """The scraped metric families an expression needs, through the recording rules."""
    needed: set[str] = set()
    todo, seen = list(NAME.findall(expr)), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in recorded:
            todo.extend(recorded[name])
        elif name.startswith("torchfleet_"):
            needed.add(name if name in NEW_CONTRACT else HISTOGRAM_SUFFIX.sub("", name))
    return needed


def panel_targets(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    """What Grafana sends with every variable on "All" (allValue `.*`)."""
    return expr.replace("$stack", ".*").replace("$node", ".*")


@pytest.fixture
def live(tmp_path: Path, filters: ModuleType):
    runtime_bin = Path(
        os.environ.get("TORCHFLEET_RUNTIME_BIN", Path(sys.executable).parent / "torchfleet-runtime")
    )
    stack = LiveStack(tmp_path, filters, runtime_bin, {"TorchfleetNodeNotReady": "2s"})
    try:
        yield stack
    finally:
        stack.close()


@pytest.mark.timeout(300)
def test_every_panel_has_data_and_not_ready_fires(live: LiveStack, tmp_path: Path) -> None:
    started = time.monotonic()
    board = dashboard.build()
    targets = panel_targets(board)
    assert len(targets) >= 25, targets

    live.start_runtime()
    live.start_node_exporter()
    live.start_spend_exporter()
    prom_file, am_file = live.configure()
    live.start_monitoring(prom_file, am_file)
    live.wait_node_ready()
    wait_for(
        "both node targets up",
        lambda: len(live.query('up{job=~"torchfleet-(runtime|node)"} == 1')) == 2,
        30,
    )

    load_s = float(os.environ.get("TORCHFLEET_LIVE_LOAD_S", "8"))
    load_started = time.time()
    codes = live.load(seconds=load_s, max_requests=int(60 * load_s), min_ok=20)
    loaded_s = time.time() - load_started  # the cap on requests can end it before load_s
    assert codes.get(200, 0) >= 20 and codes.get(400) == 5, codes

    exported = live.runtime_metric_names()
    legacy_runtime = not any(m in exported for m in NEW_CONTRACT)
    recorded = _recorded()
    pending = {
        (title, expr)
        for title, expr in targets
        if legacy_runtime and raw_metrics(expr, recorded) & set(NEW_CONTRACT)
    }
    # The CUDA allocator's series exist only for CUDA replicas: none on this machine's CPU
    # replicas (the runtime's GPU-marked tests and the promtool tests cover them).
    cuda = any(m.startswith(CUDA_ONLY) for m in exported)
    no_cuda = {
        (title, expr)
        for title, expr in targets
        if not cuda and any(m.startswith(CUDA_ONLY) for m in raw_metrics(expr, recorded))
    }
    assert cuda or len(no_cuda) >= 3, no_cuda  # the "One node" row's allocator panels
    pending |= no_cuda

    # Recording rules evaluate every second; give the last rates a few evaluations. A query
    # against a day earlier has no data in a fresh Prometheus: the same query now must.
    def empty_targets() -> list[tuple[str, str]]:
        return [
            (title, expr)
            for title, expr in targets
            if (title, expr) not in pending
            and not live.query(substitute(expr.replace(" offset 1d", "")))
        ]

    deadline = time.monotonic() + 20
    empty = empty_targets()
    while empty and time.monotonic() < deadline:
        time.sleep(1)
        empty = empty_targets()
    assert not empty, "panel queries without data:\n" + "\n".join(f"  {t}: {e}" for t, e in empty)

    # Labels the scrape configuration promises on every node series.
    series = live.query(f'torchfleet_ready{{node="{NODE_NAME}"}}')
    assert series and {
        k: series[0]["metric"][k] for k in ("stack", "instance_type", "lifecycle")
    } == {"stack": STACK, "instance_type": "g5.xlarge", "lifecycle": "spot"}
    gpu = live.query("node_gpu:torchfleet_node_gpu_memory_used:ratio")
    assert gpu and abs(float(gpu[0]["value"][1]) - 9216 / 23028) < 1e-9, gpu
    cost = live.query("stack:torchfleet_cost_usd_per_hour:estimate")
    assert cost and abs(float(cost[0]["value"][1]) - 1.006 * 0.40) < 1e-3, cost  # g5.xlarge spot

    # The picture: every panel's range result, drawn like the dashboard.
    end = time.time()

    def fetch(expr: str) -> list[render.Series]:
        data = live.api(
            "query_range", query=substitute(expr), start=load_started - 5, end=end, step=1
        )
        return [
            (r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
        ]

    png = Path(os.environ.get("TORCHFLEET_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    load1 = os.getloadavg()[0]
    render.render(
        board,
        fetch,
        png,
        f"rendered with matplotlib from a live Prometheus scraping "
        f"torchfleet-runtime on loopback ({codes.get(200, 0)} predictions in {loaded_s:.0f} s, "
        f"load average {load1:.1f}); GPU panels from a recorded-format nvidia-smi sample",
    )
    assert png.stat().st_size > 50_000

    # Healthy: nothing that should not be firing is.
    firing = {
        a["labels"]["alertname"] for a in live.api("alerts")["alerts"] if a["state"] == "firing"
    }
    assert not firing & {
        "TorchfleetNodeNotReady",
        "TorchfleetGpuMemoryHigh",
        "TorchfleetTargetDown",
        "TorchfleetErrorBudgetBurnFast",
    }, firing

    # Stop the runtime: its node is not serving, the alert fires and reaches the receiver.
    assert live.stop("runtime") == 0, live.log("runtime")
    alert = wait_for(
        "TorchfleetNodeNotReady firing", lambda: live.alerts("TorchfleetNodeNotReady"), 30
    )
    assert alert[0]["labels"]["node"] == NODE_NAME and alert[0]["labels"]["stack"] == STACK
    delivered = wait_for(
        "the webhook notified", lambda: live.webhook.alerts("TorchfleetNodeNotReady"), 30
    )
    assert delivered[0]["labels"]["severity"] == "ticket"

    elapsed = time.monotonic() - started
    print(f"\nlive monitoring test: {elapsed:.0f} s, {codes}, load average {load1:.2f}")
    if pending - no_cuda:
        pytest.xfail(
            "the runtime under test predates the metric contract; panels waiting for it: "
            + "; ".join(sorted({t for t, _ in pending - no_cuda}))
        )
