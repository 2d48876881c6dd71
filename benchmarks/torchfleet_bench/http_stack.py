"""`torchfleet-bench http-stack`: which HTTP stack for the runtime's edge: server CPU per request and p50/p99 under wrk.

Every candidate serves the same application: POST /v1/predict reads the whole body, parses it
with json.loads, and answers a small JSON object (10 floats), keep-alive, TCP_NODELAY, no access
log. The client is the same for all (wrk, closed loop, one thread); per level the server's own
CPU time (GET /cpu: the process's user+system seconds) is read before and after, so
`cpu_us_per_req` is the server's cost alone, whatever wrk and the neighbours use.

Candidates (those not installed are skipped and listed):
  stdlib      http.server.ThreadingHTTPServer, HTTP/1.1 (what the runtime used before)
  aiohttp     aiohttp.web (llhttp C parser), one route
  uvicorn-httptools / uvicorn-h11   uvicorn with a bare ASGI app (no framework on top)
  torchfleet  torchfleet_runtime.httpd (asyncio + httptools), what the runtime serves on now

    torchfleet-bench http-stack [--duration 5] [--rounds 2] [--body-kb 2] [--concurrency 8,32,64]
    # another interpreter (e.g. Python 3.9 in a container sharing the host network):
    torchfleet-bench http-stack --python "podman exec CTR python3" --label py39

The servers run this file as a script (`PYTHON http_stack.py --serve NAME`) in the interpreter
under test: it imports nothing of the project at the top, and parses as Python 3.9.

Rounds rotate the order of the candidates, and each figure is the median over rounds: the
machine is shared, so compare candidates measured in the same minute and note the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
CANDIDATES = ("stdlib", "aiohttp", "uvicorn-httptools", "uvicorn-h11", "torchfleet")
ANSWER = json.dumps({"outputs": [0.125 * i for i in range(10)]}).encode()


def _cpu() -> bytes:
    return json.dumps({"cpu_s": time.process_time()}).encode()


# --------------------------------------------------------------------------- the servers


def serve_stdlib(port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(_cpu())

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", 0))
            json.loads(self.rfile.read(n))
            self._send(ANSWER)

    class S(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    S(("127.0.0.1", port), H).serve_forever()


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def predict(request: web.Request) -> web.Response:
        json.loads(await request.read())
        return web.Response(body=ANSWER, content_type="application/json")

    async def cpu(request: web.Request) -> web.Response:
        return web.Response(body=_cpu(), content_type="application/json")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/predict", predict)
    app.router.add_get("/cpu", cpu)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=1024)


def serve_uvicorn(port: int, http: str) -> None:
    import uvicorn

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "POST":
            chunks = []
            more = True
            while more:
                msg = await receive()
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
            json.loads(b"".join(chunks))
            body = ANSWER
        else:
            body = _cpu()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http=http,
        loop="asyncio",
        lifespan="off",
        access_log=False,
        log_level="warning",
        backlog=1024,
    )


def serve_torchfleet(port: int) -> None:
    from torchfleet_runtime.httpd import HttpServer, Response

    class App:
        def on_headers(self, req: Any) -> None:
            return None

        def handle(self, req: Any) -> Response:
            if req.method == "POST":
                json.loads(req.body)
                return Response(200, ANSWER)
            return Response(200, _cpu())

        def aborted(self, req: Any, exc: Any) -> None:
            pass

    server = HttpServer(App(), "127.0.0.1", port, 10.0, 30.0, 75.0, 4096, 64 * 2**20)
    server.start()
    while True:
        time.sleep(3600)


def _exit_with_stdin() -> None:
    """The driver holds our stdin open: when it closes it (or dies), stop, wherever we run
    (a `podman exec -i` server outlives a killed client otherwise)."""
    import threading

    def watch() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(name: str, port: int) -> None:
    _exit_with_stdin()
    if name == "stdlib":
        serve_stdlib(port)
    elif name == "aiohttp":
        serve_aiohttp(port)
    elif name.startswith("uvicorn-"):
        serve_uvicorn(port, name.split("-", 1)[1])
    elif name == "torchfleet":
        serve_torchfleet(port)
    else:
        raise SystemExit(f"unknown candidate {name!r}; allowed: {', '.join(CANDIDATES)}")


def available(name: str) -> bool:
    code = {
        "stdlib": "import http.server",
        "aiohttp": "import aiohttp",
        "uvicorn-httptools": "import uvicorn, httptools",
        "uvicorn-h11": "import uvicorn, h11",
        "torchfleet": "import torchfleet_runtime.httpd",
    }[name]
    return subprocess.run([*PYTHON, "-c", code], capture_output=True, env=_env()).returncode == 0


# --------------------------------------------------------------------------- the driver

PYTHON: list[str] = [sys.executable]
LUA = """
local f = io.open(os.getenv("BODY_FILE"), "rb")
wrk.body = f:read("*all")
f:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(HERE.parents[2] / "runtime" / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/cpu", timeout=10) as r:
        return float(json.loads(r.read())["cpu_s"])


def start(name: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [*PYTHON, str(HERE), "--serve", name, "--port", str(port)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            cpu_s(port)
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not answer on port {port}")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_wrk(port: int, conc: int, seconds: float, lua: Path, body: Path) -> dict[str, Any]:
    cmd = [
        "wrk",
        "-t1",
        f"-c{conc}",
        f"-d{seconds:g}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(lua),
        f"http://127.0.0.1:{port}/v1/predict",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        env={**os.environ, "BODY_FILE": str(body)},
    ).stdout
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    if not m or "50" not in lat:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    return {
        "requests": int(m.group(1)),
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(lat["50"]),
        "p99_ms": _ms(lat["99"]),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": sock.group(1) if sock else "",
    }


def measure(
    names: list[str], concs: list[int], seconds: float, rounds: int, body_kb: float
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="torchfleet-httpbench-"))
    try:
        lua = tmp / "post.lua"
        lua.write_text(LUA)
        body = tmp / "body.json"
        rng = random.Random(0)
        n = max(1, int(body_kb * 1024 / 7))
        body.write_text(json.dumps({"inputs": [round(rng.random(), 4) for _ in range(n)]}))
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {
            n: {c: [] for c in concs} for n in names
        }
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                proc, port = start(name)
                try:
                    run_wrk(port, 8, 1.0, lua, body)  # warm-up: connections, caches, code paths
                    for c in concs:
                        load = os.getloadavg()[0]
                        c0 = cpu_s(port)
                        res = run_wrk(port, c, seconds, lua, body)
                        res["cpu_us_per_req"] = round(
                            (cpu_s(port) - c0) / max(res["requests"], 1) * 1e6, 1
                        )
                        res["load1"] = round(load, 2)
                        runs[name][c].append(res)
                        print(
                            f"round {r + 1} {name:<18} c={c:<3} {res['rps']:8.0f} req/s  p50 {res['p50_ms']:7.2f} ms"
                            f"  p99 {res['p99_ms']:7.2f} ms  cpu {res['cpu_us_per_req']:6.0f} us/req  load {load:.1f}",
                            flush=True,
                        )
                finally:
                    proc.stdin.close()  # type: ignore[union-attr]  # the server exits on EOF
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        summary = {
            name: {
                str(c): {
                    k: statistics.median(x[k] for x in lvl)
                    for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req")
                }
                for c, lvl in per.items()
            }
            for name, per in runs.items()
        }
        return {"body_bytes": body.stat().st_size, "runs": runs, "median": summary}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench http-stack", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--concurrency", default="8,32,64")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per level (default 5)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="rounds, candidate order rotated (default 2)"
    )
    ap.add_argument("--body-kb", type=float, default=2.0, help="JSON body size in KiB (default 2)")
    ap.add_argument("--python", help="interpreter command for the servers (default: this one)")
    ap.add_argument("--label", default="", help="a name for this run in the output file")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    global PYTHON
    if args.python:
        PYTHON = shlex.split(args.python)
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    names = [n for n in args.candidates.split(",") if n]
    have = [n for n in names if available(n)]
    for n in set(names) - set(have):
        print(f"skipped {n}: not importable by {' '.join(PYTHON)}")
    version = subprocess.run(
        [*PYTHON, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        env=_env(),
    ).stdout.strip()
    print(f"Python {version}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at start")
    result = measure(
        have,
        [int(c) for c in args.concurrency.split(",")],
        args.duration,
        args.rounds,
        args.body_kb,
    )
    result.update(python=version, label=args.label, loadavg_end=round(os.getloadavg()[0], 2))
    print(
        f"\nmedian of {args.rounds} round(s), body {result['body_bytes']} bytes, load {result['loadavg_end']} at end"
    )
    print(
        f"{'stack':<18}"
        + "".join(
            f"{'c=' + c + ' req/s':>12}{'p50 ms':>8}{'p99 ms':>8}{'us/req':>8}"
            for c in args.concurrency.split(",")
        )
    )
    for name, per in result["median"].items():
        print(
            f"{name:<18}"
            + "".join(
                f"{v['rps']:>12.0f}{v['p50_ms']:>8.2f}{v['p99_ms']:>8.2f}{v['cpu_us_per_req']:>8.0f}"
                for v in per.values()
            )
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":  # the servers' entry (--serve), in the interpreter under test
    sys.exit(main())
