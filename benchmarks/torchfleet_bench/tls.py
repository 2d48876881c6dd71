"""`torchfleet-bench tls`: what HTTPS on the node itself (the runtime's tls_cert_file, instances
mode) costs per request against plain HTTP, on the same demo model and the same small body.

Two `torchfleet-runtime serve` processes on loopback, one plain, one with a certificate of a CA
made for the run (trustme); per server, request and connection pattern it sends sequential
requests (one client, so the figures are per request, not a throughput race): GET /livez
(LIVEZ_FACTOR x REQUESTS of them: no model work, so what TLS adds is not lost in the model's
noise) and POST /v1/predict of one instance (REQUESTS), and reads:
- the server's own CPU per request (/proc: user + system, whatever the client and the
  neighbours use), the figure TLS adds to;
- the client-side p50 and p99 latency.
Patterns: `keep-alive` (one connection: TLS adds record encryption only) and `new connection`
(a TCP connect and, over TLS, a full handshake for every request: the worst case, a client that
never reuses a connection). Rounds alternate the servers; each figure is the median of rounds.

    torchfleet-bench tls [--requests 300] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

from infra.client import Auth, Target, card_payload, get_json, post_once
from torchfleet_bench.local import cpu_s, free_port
from torchfleet_bench.report import host_info
from torchfleet_bench.runtime import child_env, runtime_cmd

PATTERNS = ("keep-alive", "new connection")
LIVEZ_FACTOR = 5


def _serve(model: Path, tls: tuple[Path, Path] | None, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    extra = ["--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1])] if tls else []
    cmd = runtime_cmd(
        "serve", "--model", str(model), "--port", str(port), "--log-level", "warning", *extra
    )
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    return proc, port


def _wait_ready(proc: subprocess.Popen, target: Target, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}")
        try:
            conn = target.connection(2.0)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"serve not ready after {timeout_s:g} s")


def _get_once(conn: HTTPConnection, path: str) -> int:
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def _measure(
    pid: int, target: Target, pattern: str, body: bytes | None, headers: dict[str, str], n: int
) -> dict[str, float]:
    """n requests: POST /v1/predict with `body`, or GET /livez when body is None."""
    latencies = []
    conn = target.connection(30.0)
    before = cpu_s(pid)
    for _ in range(n):
        t0 = time.perf_counter()
        if body is None:
            status = _get_once(conn, "/livez")
        else:
            status, _, _ = post_once(conn, "/v1/predict", body, headers)
        if pattern == "new connection":
            conn.close()
            conn = target.connection(30.0)
        latencies.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"{target.url}: answered {status}")
    used = cpu_s(pid) - before
    conn.close()
    latencies.sort()
    return {
        "server_cpu_us_per_req": used / n * 1e6,
        "p50_ms": latencies[n // 2] * 1000,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000,
    }


def run(requests: int, rounds: int) -> dict[str, Any]:
    import trustme

    kinds = {"GET /livez": LIVEZ_FACTOR * requests, "POST /v1/predict": requests}
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-tls-") as tmp:
        work = Path(tmp)
        subprocess.run(
            runtime_cmd("demo-model", str(work / "model")), check=True, stdout=subprocess.DEVNULL
        )
        model = work / "model" / "model.pt"
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.cert_chain_pems[0].write_to_path(str(work / "cert.pem"))
        cert.private_key_pem.write_to_path(str(work / "key.pem"))
        ca.cert_pem.write_to_path(str(work / "ca.pem"))
        auth = Auth(cafile=str(work / "ca.pem"))
        servers = {}
        try:
            for scheme, tls in (("http", None), ("https", (work / "cert.pem", work / "key.pem"))):
                proc, port = _serve(model, tls, work / f"{scheme}.log")
                servers[scheme] = (proc, Target(scheme, "127.0.0.1", port, "", auth))
            for proc, target in servers.values():
                _wait_ready(proc, target)
            card = get_json(servers["http"][1], "/v1/model", 30.0)
            body, headers = card_payload(card, batch=1, binary=True)
            for r in range(rounds):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for scheme in order:
                    proc, target = servers[scheme]
                    for kind, n in kinds.items():
                        sent = None if kind.startswith("GET") else body
                        for pattern in PATTERNS:
                            _measure(proc.pid, target, pattern, sent, headers, 20)  # warm
                            results.setdefault(f"{scheme} {pattern}, {kind}", []).append(
                                _measure(proc.pid, target, pattern, sent, headers, n)
                            )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host_info(),
        "requests": requests,
        "livez_requests": LIVEZ_FACTOR * requests,
        "rounds": rounds,
        "results": {},
    }
    for name, runs in results.items():
        report["results"][name] = {
            k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchfleet-bench tls", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=300, help="per server, pattern and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    report = run(args.requests, args.rounds)
    rows = report["results"]
    print(
        f"{'server, connection, request':<44} {'server CPU us/req':>18} {'p50 ms':>8} {'p99 ms':>8}"
    )
    for name, row in rows.items():
        print(
            f"{name:<44} {row['server_cpu_us_per_req']:>18.0f} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f}"
        )
    for name in [n for n in rows if n.startswith("http ")]:
        plain, tls = rows[name], rows["https " + name[len("http ") :]]
        extra = tls["server_cpu_us_per_req"] - plain["server_cpu_us_per_req"]
        p50 = tls["p50_ms"] - plain["p50_ms"]
        print(
            f"TLS, {name[len('http ') :]}: {extra:+.0f} us server CPU, {p50:+.3f} ms p50 per "
            f"request ({tls['server_cpu_us_per_req'] / plain['server_cpu_us_per_req']:.2f}x)"
        )
    print(f"load average {', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
