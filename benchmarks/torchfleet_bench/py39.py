"""`torchfleet-bench py39`: the runtime on the legacy stack (Debian 11, Python 3.9, torch 1.12.1,
numpy<2): a functional check and its CPU per request under wrk, from the host.

The Molecule image of the legacy scenario runs `torchfleet-runtime serve` on the demo model with
the cp39 wheelhouse unpacked (no pip inside), sharing the host's network; the host checks a JSON
and a binary prediction, a client mistake (400), a reload by SIGHUP (new version served, same
process), then drives wrk at c=8/32/64 with the 91 KB JSON body and reads the server's CPU per
request from its own process_cpu_seconds_total. The container is removed at the end.

    torchfleet-bench py39 [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from infra.client import build_payload

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".cache" / "wheelhouse-cp39"


def sh(*cmd: str, check: bool = True, timeout: float = 900) -> str:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout).stdout


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def metric(text: str, name: str, label: str = "") -> float:
    """The sum of `name`'s series that carry `label` (`code="200"`; none: every series)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or (line.startswith(name + "{") and label in line):
            total += float(line.split()[-1])
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchfleet-bench py39", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None or not WHEELHOUSE.is_dir():
        print(
            "needs wrk and .cache/wheelhouse-cp39 (tests/roles/prepare_wheelhouse.sh cp39)",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault(
        "CONTAINERS_CONF", str(ROOT / "tests" / "roles" / "containers.conf")
    )  # runc, ulimits
    env = dict(os.environ)
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_image.sh"), "bullseye"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    name = f"torchfleet-runtime-py39-{random.randrange(1 << 30)}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="torchfleet-py39-"))
    try:
        sh(
            "podman",
            "run",
            "-d",
            "--rm",
            "--name",
            name,
            "--network",
            "host",
            "-v",
            f"{ROOT}:{ROOT}:ro",
            "-v",
            f"{WHEELHOUSE}:/wheels:ro",
            "-v",
            f"{tmp}:/scratch",
            "--entrypoint",
            "sleep",
            "localhost/torchfleet-bullseye:latest",
            "3600",
        )
        t0 = time.monotonic()
        sh(
            "podman",
            "exec",
            name,
            "sh",
            "-c",
            "mkdir -p /opt/site && for w in /wheels/*.whl; do "
            'python3 -m zipfile -e "$w" /opt/site; done',
        )
        print(f"wheels unpacked in {time.monotonic() - t0:.0f} s")
        py = ["podman", "exec", "-e", f"PYTHONPATH={ROOT}/runtime/src:/opt/site", name, "python3"]
        cli = [*py, "-c", "import sys; from torchfleet_runtime.cli import main; sys.exit(main())"]
        sh(*cli, "demo-model", "/scratch/demo")
        stack = json.loads(
            sh(
                *py,
                "-c",
                "import json, platform, torch, numpy; print(json.dumps({'python': "
                "platform.python_version(), 'torch': torch.__version__, 'numpy': numpy.__version__}))",
            )
        )
        print(f"stack {stack}")
        started = time.monotonic()
        server = subprocess.Popen(
            [
                *cli,
                "serve",
                "--model",
                "/scratch/demo/model.pt",
                "--port",
                str(port),
                "--spot-watch",
                "off",
                "--log-format",
                "json",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "serve.log", "w"),  # noqa: SIM115 - the server outlives this block
        )
        while not _ready(base):
            if server.poll() is not None or time.monotonic() - started > 300:
                print((tmp / "serve.log").read_text()[-3000:])
                return 1
            time.sleep(0.05)
        print(f"start -> ready {time.monotonic() - started:.2f} s (container exec included)")
        meta = json.loads((tmp / "demo" / "model.json").read_text())
        ok = True
        for binary in (False, True):
            body, headers = build_payload(meta["input_shape"], "float32", 2, binary)
            status, hdrs, data = http("POST", base + "/v1/predict", body, headers)
            good = (
                status == 200
                and len(json.loads(data)["outputs"]) == 2
                and hdrs.get("X-Model-Version")
            )
            print(
                f"{'binary' if binary else 'JSON'} predict of 2 -> {status}, version {hdrs.get('X-Model-Version')}"
            )
            ok &= bool(good)
        status, _, data = http(
            "POST",
            base + "/v1/predict",
            b'{"inputs": [1, 2]}',
            {"Content-Type": "application/json"},
        )
        print(f"a client mistake -> {status} {data[:100]!r}")
        ok &= status == 400
        pid = sh("podman", "exec", name, "sh", "-c", "pgrep -f 'serve --model' | head -1").strip()
        (tmp / "demo" / "model.json").write_text(json.dumps({**meta, "version": "py39-reload"}))
        sh("podman", "exec", name, "kill", "-HUP", pid)
        deadline = time.monotonic() + 120
        while json.loads(http("GET", base + "/v1/model")[2]).get("model_version") != "py39-reload":
            if time.monotonic() > deadline:
                print("the reload did not happen within 120 s")
                return 1
            time.sleep(0.1)
        same = (
            sh("podman", "exec", name, "sh", "-c", "pgrep -f 'serve --model' | head -1").strip()
            == pid
        )
        print(
            f"SIGHUP -> version py39-reload served by the same process: {same}; "
            f"/readyz {http('GET', base + '/readyz')[0]}"
        )
        ok &= same
        body, headers = build_payload(meta["input_shape"], "float32", 1, False, decimals=4)
        (tmp / "body").write_bytes(body)
        lua = tmp / "post.lua"
        lua.write_text(
            'local f = io.open(os.getenv("B"), "rb")\nwrk.body = f:read("*all")\nf:close()\n'
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        )
        for conc in (8, 32, 64):
            m0 = http("GET", base + "/metrics")[2].decode()
            load = os.getloadavg()[0]
            out = subprocess.run(
                [
                    "wrk",
                    "-t1",
                    f"-c{conc}",
                    f"-d{args.seconds}s",
                    "--latency",
                    "--timeout",
                    "10s",
                    "-s",
                    str(lua),
                    base + "/v1/predict",
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "B": str(tmp / "body")},
            ).stdout
            m1 = http("GET", base + "/metrics")[2].decode()
            n = metric(m1, "torchfleet_requests_total", 'code="200"') - metric(
                m0, "torchfleet_requests_total", 'code="200"'
            )
            cpu = metric(m1, "process_cpu_seconds_total") - metric(m0, "process_cpu_seconds_total")
            lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
            rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
            print(
                f"wrk c={conc}: {rps.group(1) if rps else '?'} req/s p50 {lat.get('50')} p99 {lat.get('99')} "
                f"server CPU {cpu / max(n, 1) * 1000:.2f} ms/request ({int(n)} answered) load {load:.1f}"
            )
        server.terminate()
        sh("podman", "exec", name, "kill", "-TERM", pid, check=False)
        return 0 if ok else 1
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, env=env)
        shutil.rmtree(tmp, ignore_errors=True)


def _ready(base: str) -> bool:
    try:
        return http("GET", base + "/readyz")[0] == 200
    except OSError:  # not listening yet
        return False
