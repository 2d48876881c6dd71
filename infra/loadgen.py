"""The load generator: closed-loop load on a runtime's /v1/predict from the controller side, and
the offline (in-process) best-batch throughput of the same model, so served / offline is one number.

    python -m infra.loadgen http://NODE:8080 --concurrency 1,8,32,64 [--binary] [--json OUT]
    python -m infra.loadgen --offline model.pt        (needs torch; nothing else does)

It is a client tool: it lives with the controller code, not in the package every node installs.
Standard library only (torch is imported for --offline alone, numpy never); the benchmarks
(benchmarks/runtime_bench.py) and the `torchfleet` CLI import it.

Closed loop: each of C workers sends its next request when the previous one answered, so C is
the number of requests in flight. Per concurrency level it reports throughput (requests/s and
items/s), p50/p90/p99 latency of successful requests, and errors by status code.

Why threads with one keep-alive `http.client` connection each: a request costs the client one
send and one blocking recv, both of which release the GIL, plus some Python. Every result
reports that cost as `client_cpu_us_per_request` (process CPU time / requests), so one core's
ceiling is 1e6 / that figure, far above what a CPU-served model reaches (measured:
benchmarks/README.md, "The load generator's own cost"). A new TCP connection per request
(urllib) would add a connect and a server-side accept to every request and measure the client,
not the server; processes would only pay off where a GPU node with a small model brings the
server's rate near the client's ceiling.

Inputs are built from the server's GET /v1/model (input_shape, dtype) with a fixed seed, sent as
JSON `{"inputs": ...}` or, with --binary, as raw little-endian bytes with X-Shape/X-Dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import math
import os
import platform
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONCURRENCY = (1, 8, 32, 64)
DEFAULT_DURATION_S = 10.0
PERCENTILES = (50, 90, 99)


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreachable server): one line, exit status 2."""


# --------------------------------------------------------------------------- pure helpers


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


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        levels = []
    if not levels or any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError(
            f"--concurrency {text!r}: expected a comma-separated list of positive integers, e.g. 1,8,32,64"
        )
    return levels


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: expected positive integers such as 3,64,64"
        )
    return dims


def _positive(kind: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive number")
        return value

    return convert


@dataclass
class Target:
    scheme: str
    host: str
    port: int
    prefix: str  # path before /v1/..., usually ""

    @classmethod
    def parse(cls, url: str) -> Target:
        """'http://h:8080', 'http://h:8080/', 'http://h:8080/v1/predict' or 'h:8080'."""
        if "://" not in url:
            url = "http://" + url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"URL {url!r}: expected http://HOST:PORT")
        path = parts.path.rstrip("/")
        for suffix in ("/v1/predict", "/v1/model"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, path)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = _NoDelayHTTPSConnection if self.scheme == "https" else _NoDelayHTTPConnection
        return kind(self.host, self.port, timeout=timeout)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    """TCP_NODELAY, as wrk and other load generators set: with Nagle on, the tail segment of a
    large body can wait for the peer's delayed ACK (40 ms on Linux) and the benchmark would
    measure TCP timers instead of the server."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# --------------------------------------------------------------------------- payloads


# struct codes of the dtypes a body may carry (bfloat16: the high half of a float32)
DTYPE_CODES = {
    "float32": "f",
    "float64": "d",
    "float16": "e",
    "bfloat16": "f",
    "int64": "q",
    "int32": "i",
    "uint8": "B",
    "int8": "b",
    "bool": "?",
}


def _check_dtype(name: str) -> str:
    if name not in DTYPE_CODES:
        raise BenchError(f"dtype {name!r} is not one of {', '.join(DTYPE_CODES)}")
    return name


def _prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def sample_values(count: int, dtype: str, seed: int = 0) -> list[Any]:
    """Deterministic inputs: floats in [0, 1) exactly representable in float32 (so JSON and
    binary carry the same tensor), integers in [0, 10), booleans."""
    rng = random.Random(seed)
    if dtype == "bool":
        return [rng.random() < 0.5 for _ in range(count)]
    if DTYPE_CODES[dtype] in "qiBb":
        return [rng.randrange(10) for _ in range(count)]
    return [
        rng.getrandbits(8) / 256.0 for _ in range(count)
    ]  # like pixels: exact in bfloat16 and float16 too


def pack(values: Sequence[Any], dtype: str) -> bytes:
    """Raw little-endian bytes of `values` as `dtype`, without numpy."""
    if sys.byteorder != "little":
        raise BenchError("the binary body is little-endian; this client runs on a big-endian CPU")
    data = struct.pack(f"<{len(values)}{DTYPE_CODES[dtype]}", *values)
    if dtype == "bfloat16":  # keep the high two bytes of each little-endian float32
        data = b"".join(data[i + 2 : i + 4] for i in range(0, len(data), 4))
    return data


def nest(flat: Sequence[Any], shape: Sequence[int]) -> Any:
    """A flat list reshaped into nested lists of `shape`."""
    if len(shape) <= 1:
        return list(flat)
    step = _prod(shape[1:])
    return [nest(flat[i : i + step], shape[1:]) for i in range(0, len(flat), step)]


def build_payload(
    shape: Sequence[int],
    dtype: str,
    batch: int,
    binary: bool,
    seed: int = 0,
    decimals: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for one POST /v1/predict of `batch` instances; `decimals` rounds the
    floats (a shorter JSON body, as clients that send rounded pixels do)."""
    full = (batch, *shape)
    values = sample_values(_prod(full), _check_dtype(dtype), seed)
    if decimals is not None and DTYPE_CODES[dtype] in "fde":
        values = [round(v, decimals) for v in values]
    if binary:
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Shape": ",".join(str(d) for d in full),
            "X-Dtype": dtype,
        }
        return pack(values, dtype), headers
    body = json.dumps({"inputs": nest(values, full)}, separators=(",", ":")).encode()
    return body, {"Content-Type": "application/json"}


def input_spec(info: dict[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """(input_shape, dtype) from a /v1/model answer or a model.json sidecar."""
    nested = info.get("input") if isinstance(info.get("input"), dict) else {}
    shape = info.get("input_shape") or info.get("shape") or nested.get("shape")
    dtype = info.get("dtype") or info.get("input_dtype") or nested.get("dtype")
    try:
        shape_t = tuple(int(d) for d in shape) if shape else None
    except (TypeError, ValueError):
        shape_t = None
    return shape_t, (str(dtype) if dtype else None)


# --------------------------------------------------------------------------- HTTP client


def http_get_json(target: Target, path: str, timeout: float) -> dict[str, Any]:
    conn = target.connection(timeout)
    try:
        conn.request("GET", target.prefix + path)
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"GET {target.url}{path}: {exc}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise BenchError(f"GET {target.url}{path} answered {resp.status}: {body[:300]!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise BenchError(
            f"GET {target.url}{path}: the answer is not JSON: {body[:200]!r}"
        ) from None


def post_once(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes, bool]:
    """(status, body, keep) — keep is False when the server asked to close the connection."""
    conn.request("POST", path, body, headers)
    resp = conn.getresponse()
    data = resp.read()  # read fully: the connection can only be reused after
    return resp.status, data, not resp.will_close


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
) -> None:
    path = target.prefix + "/v1/predict"
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
) -> LevelResult:
    """One closed-loop run at `concurrency`, bounded by a request count or a duration."""
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests and duration_s")
    budget = _Budget(requests, duration_s)
    barrier = threading.Barrier(concurrency + 1, action=budget.start)
    stats = [_WorkerStats() for _ in range(concurrency)]
    threads = [
        threading.Thread(
            target=_worker,
            args=(target, body, headers, budget, barrier, warmup, timeout, s),
            name=f"bench-{concurrency}-{i}",
            daemon=True,
        )
        for i, s in enumerate(stats)
    ]
    for t in threads:
        t.start()
    barrier.wait()  # every worker connected and warmed up; budget.start() has run
    t_start, cpu_start = budget.started_at, time.process_time()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu_start
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
    )


# --------------------------------------------------------------------------- offline


def load_offline_model(path: str, device: str) -> Any:
    import torch

    try:
        model = torch.jit.load(path, map_location=device)
    except Exception as exc:  # RuntimeError for non-TorchScript files, OSError if missing
        raise BenchError(f"--offline {path}: not a loadable TorchScript file ({exc})") from None
    return model.eval()


def served_graph(
    path: str, shape: Sequence[int], dtype: str, device: str, precision: str
) -> tuple[Any, dict[str, Any]]:
    """The module torchfleet-runtime serves for this file, and what its optimiser did: the
    runtime's own loader and `optimize` (runtime/src/torchfleet_runtime/optimize.py) with its
    defaults, so served / offline compares the server with the graph it really runs."""
    try:
        from torchfleet_runtime.config import Config, ConfigError
        from torchfleet_runtime.model import ModelError, load
        from torchfleet_runtime.optimize import optimize
        from torchfleet_runtime.warmup import load_sample
    except ImportError as exc:
        raise BenchError(
            f"--optimize auto needs the torchfleet-runtime package ({exc}); install it, or give "
            "--optimize off to time the file as loaded"
        ) from None
    cfg = Config(
        model=path, input_shape=tuple(shape), dtype=dtype, device=device, precision=precision
    )
    try:
        loaded = load(cfg)
    except (ModelError, ConfigError) as exc:
        raise BenchError(f"--offline {path}: the runtime cannot load it ({exc})") from None
    loaded = optimize(loaded, load_sample(None, loaded.metadata), cfg.optimize)
    return loaded.module, loaded.optimization


def offline_benchmark(
    model_path: str,
    shape: Sequence[int],
    dtype: str,
    device: str = "cpu",
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    min_seconds: float = 1.0,
    precision: str = "fp32",
    log: Callable[[str], None] = lambda _m: None,
    optimize: str = "auto",
) -> dict[str, Any]:
    """In-process items/s of the model at each batch size; the best is the served ceiling.
    `optimize`: auto times the graph torchfleet-runtime serves (`served_graph`), off the file.

    Per size: 3 warm-up passes (the runtime's rule; on CUDA they also let cudnn.benchmark pick
    kernels), then passes until `min_seconds` and at least 3 passes have run.
    """
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {device}: torch.cuda.is_available() is False")
    if device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
    optimization: dict[str, Any] = {"method": None, "reason": "--optimize off"}
    if optimize == "auto":
        model, optimization = served_graph(model_path, shape, dtype, device, precision)
    else:
        model = load_offline_model(model_path, device)
    log(f"  graph: {optimization.get('method') or 'as loaded'} ({optimization})")
    inference = getattr(torch, "inference_mode", torch.no_grad)  # inference_mode: torch 1.9+
    amp = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    device_type = "cuda" if device.startswith("cuda") else "cpu"

    def autocast() -> Any:
        if amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=amp)

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    rows = []
    tdtype = getattr(torch, dtype)
    for batch in batch_sizes:
        x = torch.rand((batch, *shape), generator=torch.Generator().manual_seed(0)).to(device)
        x = x.to(tdtype) if tdtype.is_floating_point else (x * 10).to(tdtype)
        with inference(), autocast():
            # at least 3 passes (the runtime's rule) and a fifth of the measured time: the
            # TorchScript profiling executor re-specialises for each new shape in early passes
            warm, t0 = 0, time.perf_counter()
            while warm < 3 or time.perf_counter() - t0 < min_seconds / 5:
                model(x)
                warm += 1
            sync()
            passes, t0 = 0, time.perf_counter()
            while True:
                model(x)
                passes += 1
                if passes >= 3:
                    sync()
                    elapsed = time.perf_counter() - t0
                    if elapsed >= min_seconds:
                        break
        row = {
            "batch": batch,
            "items_per_s": round(batch * passes / elapsed, 2),
            "batch_latency_ms": round(elapsed / passes * 1000, 3),
        }
        log(f"  offline batch {batch:>3}: {row['items_per_s']:>9.1f} items/s")
        rows.append(row)
    best = max(rows, key=lambda r: r["items_per_s"])
    return {
        "model": str(model_path),
        "device": device,
        "precision": precision,
        "optimization": optimization,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": rows,
        "best": best,
    }


# --------------------------------------------------------------------------- output


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


def write_plot(path: str, report: dict[str, Any]) -> None:
    """Latency percentiles and throughput against concurrency, one PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    levels = report["levels"]
    conc = [lv["concurrency"] for lv in levels]
    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q in PERCENTILES:
        ys = [lv["latency_ms"][f"p{q}"] for lv in levels]
        ax_lat.plot(conc, [math.nan if y is None else y for y in ys], marker="o", label=f"p{q}")
    ax_lat.set(xlabel="concurrency (requests in flight)", ylabel="latency (ms)", title="Latency")
    ax_tp.plot(conc, [lv["items_per_s"] for lv in levels], marker="o", label="served")
    offline = report.get("offline")
    if offline:
        best = offline["best"]
        ax_tp.axhline(
            best["items_per_s"],
            linestyle="--",
            color="grey",
            label=f"offline best (batch {best['batch']})",
        )
    ax_tp.set(xlabel="concurrency (requests in flight)", ylabel="items/s", title="Throughput")
    for ax in (ax_lat, ax_tp):
        if len(conc) > 1 and min(conc) > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(conc)
        ax.set_xticklabels([str(c) for c in conc])
        ax.grid(True, alpha=0.3)
        ax.legend()
    cfg = report["config"]
    fig.suptitle(
        f"{report.get('url') or 'offline'} · batch {cfg['batch']} · {cfg['body']} body",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(requirements/bench.txt pins it), or drop --plot"
        ) from None


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Closed-loop benchmark of a running server (throughput, p50/p90/p99, errors per "
        "concurrency) and/or the in-process best-batch throughput of a model (--offline)."
    )
    parser.add_argument(
        "url",
        nargs="?",
        metavar="URL",
        help="server base URL, e.g. http://127.0.0.1:8080 (optional with --offline)",
    )
    parser.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=list(DEFAULT_CONCURRENCY),
        metavar="N[,N...]",
        help="requests in flight per level (default: 1,8,32,64)",
    )
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument(
        "--duration",
        type=_positive(float, "--duration"),
        metavar="S",
        help=f"seconds per level (default: {DEFAULT_DURATION_S:g})",
    )
    bound.add_argument(
        "--requests",
        type=_positive(int, "--requests"),
        metavar="N",
        help="requests per level instead of a duration",
    )
    parser.add_argument(
        "--batch",
        type=_positive(int, "--batch"),
        default=1,
        metavar="N",
        help="instances per request (default: 1)",
    )
    parser.add_argument(
        "--binary",
        action="store_true",
        help="send raw little-endian tensor bytes (X-Shape/X-Dtype) instead of JSON",
    )
    parser.add_argument(
        "--decimals",
        type=int,
        metavar="N",
        help="round JSON floats to N decimals (a shorter body; default: exact values)",
    )
    parser.add_argument(
        "--shape",
        type=parse_shape,
        metavar="D,D,...",
        help="input shape without the batch dim (default: from /v1/model or MODEL.json)",
    )
    parser.add_argument(
        "--dtype", metavar="NAME", help="input dtype (default: from /v1/model or MODEL.json)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="unmeasured requests per worker before each level (default: 1)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        default=60.0,
        metavar="S",
        help="per-request timeout (default: 60)",
    )
    parser.add_argument(
        "--json", dest="json_out", metavar="OUT", help="write the full results as JSON"
    )
    parser.add_argument(
        "--plot", metavar="PNG", help="write a latency/throughput plot (needs matplotlib)"
    )
    parser.add_argument(
        "--offline",
        metavar="MODEL",
        help="also measure in-process best-batch throughput of this TorchScript file",
    )
    parser.add_argument("--device", default="cpu", help="device for --offline (default: cpu)")
    parser.add_argument(
        "--optimize",
        choices=("auto", "off"),
        default="auto",
        help="--offline times the graph torchfleet-runtime serves (auto: its optimiser, as "
        "`serve` runs it by default) or the file as loaded (off)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="autocast precision for --offline (default: fp32)",
    )
    parser.add_argument(
        "--offline-max-batch",
        type=_positive(int, "--offline-max-batch"),
        default=64,
        metavar="N",
        help="largest batch --offline tries, powers of two (default: 64)",
    )
    parser.add_argument(
        "--offline-seconds",
        type=_positive(float, "--offline-seconds"),
        default=1.0,
        metavar="S",
        help="measured seconds per batch size for --offline (default: 1)",
    )


def _sidecar(model_path: str) -> dict[str, Any]:
    path = Path(model_path).with_suffix(".json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _resolve_input(args: argparse.Namespace, info: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    shape, dtype = input_spec(info)
    shape = args.shape or shape
    dtype = args.dtype or dtype or "float32"
    if not shape:
        raise BenchError(
            "the input shape is unknown: the server's /v1/model and MODEL.json name no "
            "input_shape; pass --shape such as 3,64,64"
        )
    _check_dtype(dtype)
    return tuple(shape), dtype


def _probe(
    target: Target, body: bytes, headers: dict[str, str], batch: int, timeout: float
) -> None:
    """One checked request before measuring: a wrong input must not become 10 s of 400s."""
    conn = target.connection(timeout)
    try:
        status, data, _ = post_once(conn, target.prefix + "/v1/predict", body, headers)
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"POST {target.url}/v1/predict: {exc}") from None
    finally:
        conn.close()
    if status != 200:
        raise BenchError(f"POST {target.url}/v1/predict answered {status}: {data[:300]!r}")
    try:
        outputs = json.loads(data).get("outputs")
    except (ValueError, AttributeError):
        raise BenchError(
            f'POST /v1/predict: the answer is not JSON {{"outputs": ...}}: {data[:200]!r}'
        ) from None
    if isinstance(outputs, list) and len(outputs) != batch:
        raise BenchError(f"POST /v1/predict: sent {batch} instances, got {len(outputs)} outputs")


def run_bench(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole command as a function returning the report (also used by benchmarks/)."""
    if not args.url and not args.offline:
        raise BenchError("give a server URL, --offline MODEL, or both")
    if args.warmup < 0:
        raise BenchError(f"--warmup {args.warmup}: must be >= 0")
    if args.plot and not args.url:
        raise BenchError("--plot draws served latency: it needs a server URL")
    if args.plot:
        require_matplotlib()
    duration = None if args.requests else (args.duration or DEFAULT_DURATION_S)
    report: dict[str, Any] = {
        "tool": "infra.loadgen",
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "url": None,
        "model": None,
        "config": {
            "concurrency": args.concurrency,
            "duration_s": duration,
            "requests": args.requests,
            "batch": args.batch,
            "body": "binary" if args.binary else "json",
            "warmup_per_worker": args.warmup,
        },
        "levels": [],
        "offline": None,
        "served_over_offline": None,
    }
    info: dict[str, Any] = {}
    target = None
    if args.url:
        target = Target.parse(args.url)
        report["url"] = target.url
        info = http_get_json(target, "/v1/model", args.timeout)
        report["model"] = info
    elif args.offline:
        info = _sidecar(args.offline)
    shape, dtype = _resolve_input(args, info)
    report["config"].update(input_shape=list(shape), dtype=dtype)

    if target is not None:
        body, headers = build_payload(shape, dtype, args.batch, args.binary, decimals=args.decimals)
        report["config"]["body_bytes"] = len(body)
        _probe(target, body, headers, args.batch, args.timeout)
        bound = f"{args.requests} requests" if args.requests else f"{duration:g} s"
        log(
            f"bench {target.url} · batch {args.batch} · {report['config']['body']} body "
            f"{len(body) / 1024:.1f} KiB · input {'x'.join(map(str, shape))} {dtype} · {bound} per level"
        )
        for conc in args.concurrency:
            level = run_level(
                target,
                body,
                headers,
                conc,
                args.batch,
                args.requests,
                duration,
                args.warmup,
                args.timeout,
            )
            report["levels"].append(asdict(level))
            log(
                render_levels([level]).splitlines()[-1]
                if report["levels"][1:]
                else render_levels([level])
            )

    if args.offline:
        sizes = [1 << i for i in range(int(math.log2(args.offline_max_batch)) + 1)]
        log(f"offline {args.offline} on {args.device} ({args.precision}), batch sizes {sizes}")
        report["offline"] = offline_benchmark(
            args.offline,
            shape,
            dtype,
            args.device,
            sizes,
            args.offline_seconds,
            args.precision,
            log,
            args.optimize,
        )
        best = report["offline"]["best"]
        log(f"offline best: {best['items_per_s']:.1f} items/s at batch {best['batch']}")
        if report["levels"]:
            report["served_over_offline"] = {
                str(lv["concurrency"]): round(lv["items_per_s"] / best["items_per_s"], 3)
                for lv in report["levels"]
            }
            log(
                "served / offline items/s: "
                + ", ".join(f"c={c}: {r:.2f}" for c, r in report["served_over_offline"].items())
            )
    if report["levels"]:
        cpu = [
            lv["client_cpu_us_per_request"]
            for lv in report["levels"]
            if lv["client_cpu_us_per_request"]
        ]
        if cpu:
            log(f"client CPU per request: {min(cpu):.0f}-{max(cpu):.0f} us")
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = run_bench(args)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {args.json_out}")
        if args.plot:
            write_plot(args.plot, report)
            print(f"wrote {args.plot}")
    except BenchError as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    failed = any(lv["ok"] == 0 for lv in report["levels"])
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.loadgen")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
