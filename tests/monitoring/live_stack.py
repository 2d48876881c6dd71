"""A monitoring stack of real processes on loopback, configured by the role's own code:
`torchfleet-runtime serve` with the demo model, Debian's prometheus-node-exporter reading a GPU
textfile written by roles/gpu_monitoring's real exporter script (from a recorded-format
nvidia-smi line: there is no GPU here), Debian's prometheus with the role's rule files and the
scrape configuration its filter plugin builds (file_sd from an inventory), and Debian's
prometheus-alertmanager delivering to a webhook receiver in this process.

Every process is this test's child, on 127.0.0.1 ports the kernel picked, and is stopped by
`close()` (also when the test fails)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from monitoring_support import REPO, RULE_FILES, need

GPU_EXPORTER = REPO / "roles" / "gpu_monitoring" / "files" / "torchfleet_gpu_textfile.py"
# One GPU in nvidia-smi's --format=csv,noheader,nounits order (the exporter's FIELDS): an A10G
# at 87 % busy with 9 of 22.5 GiB in use.
NVIDIA_SMI_LINE = (
    "0, GPU-5f0a1c3e-live, NVIDIA A10G, 535.183.01, 87, 41, 9216, 23028, 54, "
    "141.20, 300.00, 0, 0, 0x0000000000000000"
)
STACK = "live-test"
NODE = {
    "private_ip": "127.0.0.1",
    "torchfleet_cloud": "aws",
    "torchfleet_instance_type": "g5.xlarge",
    "torchfleet_spot": True,
}
NODE_NAME = "live-gpu-0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, name: str, status: str = "firing") -> list[dict[str, Any]]:
        return [
            a
            for n in self.received
            for a in n["alerts"]
            if a["labels"].get("alertname") == name and a["status"] == status
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LiveStack:
    def __init__(
        self, work: Path, filters: ModuleType, runtime_bin: Path, for_overrides: dict[str, str]
    ) -> None:
        self.work = work
        self.filters = filters
        self.runtime_bin = runtime_bin
        self.for_overrides = for_overrides
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = {
            name: free_port() for name in ("runtime", "node", "prometheus", "alertmanager", "spend")
        }
        self.prometheus_url = f"http://127.0.0.1:{self.ports['prometheus']}"
        self.runtime_url = f"http://127.0.0.1:{self.ports['runtime']}"
        self.webhook = Webhook()
        self.spend_server: Any = None

    # --- processes --------------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True
        )
        log.close()

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def stop(self, name: str, timeout: float = 30) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        return proc.returncode

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name, timeout=10)
        self.webhook.close()
        if self.spend_server is not None:
            self.spend_server.shutdown()
            self.spend_server.server_close()

    def start_spend_exporter(self) -> None:
        """The role's spend exporter (infra/billing.py) serving a canned bill: no cloud here
        (tests/monitoring/test_spend_exporter.py reads moto's and the Alibaba fake's)."""
        from datetime import date, timedelta

        from infra import billing

        def read(start: date, end: date) -> billing.Spend:
            day = (end - timedelta(days=1)).isoformat()
            return billing.Spend(start, end, 3.5, "USD", [(day, 3.5)])

        exporter = billing.Exporter(STACK, "aws", 1, read)
        exporter.refresh()
        self.spend_server = exporter.server("127.0.0.1", self.ports["spend"])
        threading.Thread(target=self.spend_server.serve_forever, daemon=True).start()

    # --- the node ---------------------------------------------------------------------------
    def start_runtime(self) -> None:
        model_dir = self.work / "model"
        subprocess.run(
            [str(self.runtime_bin), "demo-model", str(model_dir)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        self.input_shape = json.loads((model_dir / "model.json").read_text())["input_shape"]
        self._start(
            "runtime",
            [
                str(self.runtime_bin),
                "serve",
                "--model",
                str(model_dir / "model.pt"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.ports["runtime"]),
                "--spot-watch",
                "off",
                "--log-level",
                "warning",
            ],
        )

    def start_node_exporter(self) -> None:
        textfile = self.work / "textfile"
        bindir = self.work / "bin"
        textfile.mkdir()
        bindir.mkdir()
        smi = bindir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{NVIDIA_SMI_LINE}'\n")
        smi.chmod(0o755)
        subprocess.run(
            [
                sys.executable,
                str(GPU_EXPORTER),
                "--output-dir",
                str(textfile),
                "--nvidia-smi",
                str(smi),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self._start(
            "node",
            [
                need("prometheus-node-exporter"),
                f"--web.listen-address=127.0.0.1:{self.ports['node']}",
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfile}",
            ],
        )

    def wait_node_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            self._alive("runtime")
            return http_get(self.runtime_url + "/readyz")[0] == 200

        wait_for("runtime /readyz 200", ready, timeout)
        wait_for(
            "node exporter /metrics",
            lambda: http_get(f"http://127.0.0.1:{self.ports['node']}/metrics")[0] == 200,
            30,
        )

    def runtime_metric_names(self) -> set[str]:
        _, body = http_get(self.runtime_url + "/metrics")
        return {
            line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE ")
        }

    def load(
        self, seconds: float, max_requests: int, min_ok: int, clients: int = 4
    ) -> dict[int, int]:
        """Closed-loop binary predictions from `clients` threads for `seconds` (longer, up to
        4x, until `min_ok` were answered: this machine is shared), never more than
        `max_requests`, and a few malformed bodies (400s). Returns the count per status code."""
        n = 1
        for d in self.input_shape:
            n *= d
        body = struct.pack(f"<{n}f", *([0.25] * n))
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Shape": ",".join(str(d) for d in [1, *self.input_shape]),
            "X-Dtype": "float32",
        }
        codes: dict[int, int] = {}
        lock = threading.Lock()
        sent = [0]
        start = time.monotonic()

        def more() -> bool:
            elapsed = time.monotonic() - start
            if sent[0] >= max_requests or elapsed >= 4 * seconds:
                return False
            return elapsed < seconds or codes.get(200, 0) < min_ok

        def post(data: bytes, hdrs: dict[str, str]) -> int:
            req = urllib.request.Request(self.runtime_url + "/v1/predict", data=data, headers=hdrs)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                    return resp.status
            except urllib.error.HTTPError as err:
                return err.code

        def client() -> None:
            while True:
                with lock:
                    if not more():
                        return
                    sent[0] += 1
                code = post(body, headers)
                with lock:
                    codes[code] = codes.get(code, 0) + 1

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for _ in range(5):
            code = post(b'{"inputs": [1, 2', {"Content-Type": "application/json"})
            codes[code] = codes.get(code, 0) + 1
        for t in threads:
            t.join()
        return codes

    # --- the monitoring host ----------------------------------------------------------------
    def _rules(self) -> Path:
        """The role's rule files, with the `for` of the alerts named in for_overrides shortened
        (the test cannot wait minutes; promtool's unit tests hold the real durations)."""
        rule_dir = self.work / "rules"
        rule_dir.mkdir()
        seen = set()
        for path in RULE_FILES:
            doc = yaml.safe_load(path.read_text())
            for group in doc["groups"]:
                for rule in group["rules"]:
                    if rule.get("alert") in self.for_overrides:
                        rule["for"] = self.for_overrides[rule["alert"]]
                        seen.add(rule["alert"])
            (rule_dir / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        assert seen == set(self.for_overrides), f"no such alerts: {set(self.for_overrides) - seen}"
        return rule_dir

    def configure(self) -> tuple[Path, Path]:
        f = self.filters
        sd_dir = self.work / "file_sd"
        sd_dir.mkdir()
        nodes = f.torchfleet_inventory_nodes([NODE_NAME], {NODE_NAME: NODE}, STACK)
        for job, port_key in f.NODE_JOBS:
            port = self.ports["runtime" if port_key == "runtime_port" else "node"]
            (sd_dir / f"{job}.json").write_text(json.dumps(f.torchfleet_file_sd(nodes, port)))
        prom = f.torchfleet_prometheus_config(
            {
                "stack": STACK,
                "discovery": "file",
                "file_sd_dir": str(sd_dir),
                "rule_dir": str(self._rules()),
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "runtime_port": self.ports["runtime"],
                "node_exporter_port": self.ports["node"],
                "prometheus_address": f"127.0.0.1:{self.ports['prometheus']}",
                "alertmanager_address": f"127.0.0.1:{self.ports['alertmanager']}",
                "spend_address": f"127.0.0.1:{self.ports['spend']}",
            }
        )
        am = f.torchfleet_alertmanager_config(
            {
                "receiver": "webhook",
                "webhook_url": self.webhook.url,
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1m",
            }
        )
        prom_file, am_file = self.work / "prometheus.yml", self.work / "alertmanager.yml"
        prom_file.write_text(yaml.safe_dump(prom, sort_keys=False))
        am_file.write_text(yaml.safe_dump(am, sort_keys=False))
        return prom_file, am_file

    def start_monitoring(self, prom_file: Path, am_file: Path) -> None:
        self._start(
            "alertmanager",
            [
                need("prometheus-alertmanager"),
                f"--config.file={am_file}",
                f"--storage.path={self.work / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
                "--cluster.listen-address=",
            ],
        )
        self._start(
            "prometheus",
            [
                need("prometheus"),
                f"--config.file={prom_file}",
                f"--storage.tsdb.path={self.work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
            ],
        )
        for name, port in (
            ("prometheus", self.ports["prometheus"]),
            ("alertmanager", self.ports["alertmanager"]),
        ):

            def ready(name: str = name, port: int = port) -> bool:
                self._alive(name)
                return http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200

            wait_for(f"{name} /-/ready", ready, 60)

    # --- Prometheus' HTTP API ---------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.prometheus_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        status, body = http_get(url, timeout=15)
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise AssertionError(f"GET {url} -> {status}: {body[:500]!r}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        return [
            a
            for a in self.api("alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == state
        ]
