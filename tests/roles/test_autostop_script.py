"""The autostop decision script against a real metrics endpoint on loopback.

The script is what the systemd timer runs on nodes; here it runs with this interpreter and a
small HTTP server that serves Prometheus text the way the runtime does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/autostop/files/torchfleet-autostop.py"


class Metrics:
    """What the fake runtime answers on /metrics; tests change it between calls."""

    text = ""


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = Metrics.text.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def run(tmp_path: Path, config: dict, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "autostop.json"
    path.write_text(json.dumps(config))
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def decide(tmp_path: Path, config: dict, *args: str) -> dict:
    result = run(tmp_path, config, "--dry-run", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def prom(last_request: float, gpu_ratios: tuple[float, ...] = ()) -> str:
    lines = [
        "# HELP torchfleet_last_request_timestamp_seconds Unix time of the last prediction",
        "# TYPE torchfleet_last_request_timestamp_seconds gauge",
        f"torchfleet_last_request_timestamp_seconds {last_request!r}",
        'torchfleet_requests_total{code="200"} 12.0',
    ]
    lines += [
        f'torchfleet_gpu_utilization_ratio{{gpu="{i}"}} {r}' for i, r in enumerate(gpu_ratios)
    ]
    return "\n".join(lines) + "\n"


def test_recent_request_keeps_the_node(tmp_path: Path, metrics_url: str) -> None:
    now = time.time()
    Metrics.text = prom(now - 60)
    d = decide(tmp_path, {"idle_minutes": 30, "metrics_url": metrics_url}, "--now", str(now))
    assert d["stop"] is False
    assert d["idle_since"] == "last request"
    assert 59 <= d["idle_seconds"] <= 61


def test_old_request_without_gpu_stops(tmp_path: Path, metrics_url: str) -> None:
    now = time.time()
    Metrics.text = prom(now - 31 * 60)
    d = decide(tmp_path, {"idle_minutes": 30, "metrics_url": metrics_url}, "--now", str(now))
    assert d["stop"] is True
    assert d["gpu_source"] == "no GPU"
    assert d["metrics_error"] is None


def test_busy_gpu_keeps_the_node_even_without_requests(tmp_path: Path, metrics_url: str) -> None:
    now = time.time()
    Metrics.text = prom(now - 3 * 3600, gpu_ratios=(0.01, 0.42))
    config = {"idle_minutes": 30, "gpu_threshold_percent": 5, "metrics_url": metrics_url}
    d = decide(tmp_path, config, "--now", str(now))
    assert d["stop"] is False
    assert d["gpu_source"] == "metrics"
    assert d["gpu_utilization_percent"] == pytest.approx(42.0)
    Metrics.text = prom(now - 3 * 3600, gpu_ratios=(0.01, 0.02))
    assert decide(tmp_path, config, "--now", str(now))["stop"] is True


def test_no_request_yet_counts_from_start_not_from_epoch(tmp_path: Path, metrics_url: str) -> None:
    """A 0 timestamp means "never": the idle time is measured from the service start or boot,
    never from 1970 (which would stop every freshly booted node)."""
    Metrics.text = prom(0.0)
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    now = time.time()
    d = decide(
        tmp_path,
        {
            "idle_minutes": 30,
            "metrics_url": metrics_url,
            "service": "torchfleet-test-absent.service",
        },
        "--now",
        str(now),
    )
    assert d["idle_since"] == "boot (service not active)"
    assert d["idle_seconds"] <= uptime + 5
    assert d["stop"] is (uptime >= 30 * 60)


def test_unreachable_metrics_count_from_boot(tmp_path: Path) -> None:
    config = {
        "idle_minutes": 30,
        "metrics_url": "http://127.0.0.1:9/metrics",
        "service": "torchfleet-test-absent.service",
    }
    far = time.time() + 10 * 3600
    d = decide(tmp_path, config, "--now", str(far))
    assert d["metrics_error"]
    assert d["idle_since"] == "boot (service not active)"
    assert d["stop"] is True


def test_stop_runs_the_configured_command(tmp_path: Path, metrics_url: str) -> None:
    marker = tmp_path / "stopped"
    now = time.time()
    Metrics.text = prom(now - 31 * 60)
    config = {"idle_minutes": 30, "metrics_url": metrics_url, "stop_command": f"touch {marker}"}
    result = run(tmp_path, config, "--now", str(now))
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    assert json.loads(result.stdout)["dry_run"] is False
    # dry run: same decision, nothing executed
    marker.unlink()
    assert decide(tmp_path, config, "--now", str(now))["stop"] is True
    assert not marker.exists()


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    result = run(tmp_path, {"idle_minutes": -1})
    assert result.returncode == 2
    assert "idle_minutes" in result.stderr and ">= 0" in result.stderr
    result = run(tmp_path, {"idle_minuts": 5})
    assert result.returncode == 2
    assert "idle_minuts" in result.stderr and "allowed" in result.stderr
