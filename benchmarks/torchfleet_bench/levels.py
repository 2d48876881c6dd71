"""The closed loop: C workers each send their next request when the previous one answered, so C
is the number of requests in flight; one level reports throughput (requests/s and items/s),
p50/p90/p99 latency of successful requests, errors by status code, and the client's own CPU per
request (and, given the server's process id on the same machine, the server's: its process and
its live descendants, from /proc).

Why threads with one keep-alive connection each (infra.client's `Target.connection`): a request
costs the client one send and one blocking recv, both of which release the GIL, plus some Python.
Every result reports that cost as `client_cpu_us_per_request` (process CPU time / requests), so
one core's ceiling is 1e6 / that figure, far above what a CPU-served model reaches (measured:
benchmarks/README.md, "The load generator's own cost"). A new TCP connection per request would
add a connect and a server-side accept to every request and measure the client, not the server;
processes would only pay off where a GPU node with a small model brings the server's rate near
the client's ceiling.
"""

from __future__ import annotations

import http.client
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from infra.client import Target, post_once

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already-sorted values, interpolating linearly between
    closest ranks (numpy's default method, so results compare with numpy.percentile)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/mean/min/max in milliseconds; None for each when nothing succeeded."""
    keys = [f"p{q}" for q in PERCENTILES] + ["mean", "min", "max"]
    if not latencies_s:
        return dict.fromkeys(keys)
    ms = sorted(v * 1000.0 for v in latencies_s)
    out: dict[str, float | None] = {f"p{q}": round(percentile(ms, q), 3) for q in PERCENTILES}
    out.update(mean=round(sum(ms) / len(ms), 3), min=round(ms[0], 3), max=round(ms[-1], 3))
    return out


class _Budget:
    """Decides whether a worker may send another request: a shared count, or a deadline."""

    def __init__(self, requests: int | None, duration_s: float | None) -> None:
        self._left = requests
        self._duration = duration_s
        self._deadline = math.inf
        self._lock = threading.Lock()
        self.started_at = 0.0

    def start(self) -> None:
        """Opens the window; runs as the barrier's action, once every worker has warmed up
        and before any is released."""
        self.started_at = time.perf_counter()
        if self._duration is not None:
            self._deadline = self.started_at + self._duration

    def take(self) -> bool:
        if self._left is None:
            return time.perf_counter() < self._deadline
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True


@dataclass
class _WorkerStats:
    latencies: list[float] = field(default_factory=list)  # successful requests only
    codes: Counter = field(default_factory=Counter)
    last_end: float = 0.0


def _worker(
    target: Target,
    body: bytes,
    headers: dict[str, str],
    budget: _Budget,
    start: threading.Barrier,
    warmup: int,
    timeout: float,
    stats: _WorkerStats,
    route: str,
) -> None:
    path = target.prefix + route
    conn = target.connection(timeout)
    try:
        conn.connect()  # outside the measured window, like the warm-up requests
        for _ in range(warmup):
            _status, _data, keep = post_once(conn, path, body, headers)
            if not keep:
                conn.close()
    except Exception:  # anything, or the barrier below would wait for this thread forever
        conn.close()  # a real failure shows again, counted, in the measured requests
    try:
        start.wait()
    except threading.BrokenBarrierError:
        return
    perf = time.perf_counter
    while budget.take():
        t0 = perf()
        try:
            status, _data, keep = post_once(conn, path, body, headers)
            code = str(status)
        except (OSError, http.client.HTTPException) as exc:
            code, keep = "conn:" + type(exc).__name__, False
        t1 = perf()
        stats.codes[code] += 1
        if code == "200":
            stats.latencies.append(t1 - t0)
        if not keep:
            conn.close()  # http.client reconnects on the next request
        stats.last_end = t1
    conn.close()


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    ok: int
    errors: dict[str, int]
    elapsed_s: float
    throughput_rps: float
    items_per_s: float
    latency_ms: dict[str, float | None]
    client_cpu_us_per_request: float | None
    # CPU time of the server's processes (--server-pid, the same machine) per request
    server_cpu_us_per_request: float | None = None


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (edge processes), from
    /proc/<pid>/stat (fields 14 and 15, in clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    if pid not in stats:
        raise ValueError(f"no process {pid} (--server-pid)")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats[p][1]
        todo.extend(c for c, (parent, _) in stats.items() if parent == p)
    return total


def run_level(
    target: Target,
    body: bytes,
    headers: dict[str, str],
    concurrency: int,
    batch: int,
    requests: int | None = None,
    duration_s: float | None = None,
    warmup: int = 1,
    timeout: float = 60.0,
    route: str = "/v1/predict",
    server_pid: int | None = None,
) -> LevelResult:
    """One closed-loop run at `concurrency`, bounded by a request count or a duration;
    `server_pid`: also the CPU time of that process tree per request."""
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests and duration_s")
    budget = _Budget(requests, duration_s)
    barrier = threading.Barrier(concurrency + 1, action=budget.start)
    stats = [_WorkerStats() for _ in range(concurrency)]
    threads = [
        threading.Thread(
            target=_worker,
            args=(target, body, headers, budget, barrier, warmup, timeout, s, route),
            name=f"bench-{concurrency}-{i}",
            daemon=True,
        )
        for i, s in enumerate(stats)
    ]
    for t in threads:
        t.start()
    barrier.wait()  # every worker connected and warmed up; budget.start() has run
    t_start, cpu_start = budget.started_at, time.process_time()
    server_start = process_tree_cpu_s(server_pid) if server_pid is not None else 0.0
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu_start
    server_cpu = process_tree_cpu_s(server_pid) - server_start if server_pid is not None else None
    t_end = max([s.last_end for s in stats] + [t_start])
    elapsed = max(t_end - t_start, 1e-9)
    codes: Counter = Counter()
    latencies: list[float] = []
    for s in stats:
        codes.update(s.codes)
        latencies.extend(s.latencies)
    total = sum(codes.values())
    ok = codes.pop("200", 0)
    return LevelResult(
        concurrency=concurrency,
        requests=total,
        ok=ok,
        errors=dict(sorted(codes.items())),
        elapsed_s=round(elapsed, 4),
        throughput_rps=round(ok / elapsed, 2),
        items_per_s=round(ok * batch / elapsed, 2),
        latency_ms=latency_summary(latencies),
        # process CPU / request: the client's own cost (includes the server when in-process)
        client_cpu_us_per_request=round(cpu / total * 1e6, 1) if total else None,
        server_cpu_us_per_request=(
            round(server_cpu / total * 1e6, 1) if total and server_cpu is not None else None
        ),
    )


def render_levels(levels: Sequence[LevelResult]) -> str:
    head = (
        f"{'conc':>5} {'requests':>9} {'ok':>8} {'errors':<16} {'req/s':>9} {'items/s':>9}"
        f" {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}"
    )
    lines = [head]
    for r in levels:
        errors = ",".join(f"{k}:{v}" for k, v in r.errors.items()) or "-"

        def ms(key: str, r: LevelResult = r) -> str:
            v = r.latency_ms.get(key)
            return f"{v:>9.1f}" if v is not None else f"{'-':>9}"

        lines.append(
            f"{r.concurrency:>5} {r.requests:>9} {r.ok:>8} {errors:<16} {r.throughput_rps:>9.1f}"
            f" {r.items_per_s:>9.1f} {ms('p50')} {ms('p90')} {ms('p99')}"
        )
    return "\n".join(lines)
