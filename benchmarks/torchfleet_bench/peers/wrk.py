"""Run wrk (closed loop: each connection sends its next request when the last answer arrived)
and read its result.

The counters come from the WRK_JSON line that post.lua's `done` prints (exact integers and
microsecond percentiles); when that line is missing (another script, an older wrk) the text
summary is parsed instead, with --latency's distribution for p50/p90/p99. Both paths give the
same `WrkResult`.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchfleet_bench.peers import PEERS_DIR

LUA = PEERS_DIR / "post.lua"
ERROR_KINDS = ("connect", "read", "write", "timeout")
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


class WrkError(Exception):
    pass


@dataclass
class WrkResult:
    requests: int  # completed responses, any status
    duration_s: float
    non_2xx: int  # wrk's "status" errors: answers with a status over 399 (3xx counts as ok)
    socket_errors: dict[str, int] = field(default_factory=dict)  # connect/read/write/timeout
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # p50 p90 p99 max mean
    source: str = "json"  # "json" (post.lua's line) or "text" (the printed summary)

    @property
    def ok(self) -> int:
        return max(self.requests - self.non_2xx, 0)

    @property
    def req_per_s(self) -> float:
        """Successful answers per second (a server that answers 503 fast does not win)."""
        return self.ok / self.duration_s if self.duration_s else 0.0

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, req_per_s=round(self.req_per_s, 2), errors=self.errors)
        return d


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise WrkError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse(output: str) -> WrkResult:
    """-> WrkResult from wrk's stdout (raises WrkError when it holds no result)."""
    for line in output.splitlines():
        if line.startswith("WRK_JSON "):
            return _from_json(json.loads(line[len("WRK_JSON ") :]))
    return _from_text(output)


def _from_json(d: dict[str, Any]) -> WrkResult:
    lat = d["latency_us"]
    done = d["requests"] > 0

    def ms(key: str) -> float | None:
        return round(lat[key] / 1000.0, 3) if done else None

    return WrkResult(
        requests=int(d["requests"]),
        duration_s=d["duration_us"] / 1e6,
        non_2xx=int(d["errors"]["status"]),
        socket_errors={k: int(d["errors"][k]) for k in ERROR_KINDS},
        latency_ms={k: ms(k) for k in ("p50", "p90", "p99", "max", "mean")},
        source="json",
    )


def _from_text(output: str) -> WrkResult:
    m = re.search(r"^\s*(\d+) requests in ([\d.]+\w+),", output, re.M)
    if not m:
        raise WrkError("no result in wrk's output:\n" + output[-2000:])
    requests, duration_s = int(m.group(1)), _ms(m.group(2)) / 1000.0
    dist = {
        f"p{q}": _ms(v)
        for q, v in re.findall(r"^\s+(50|90|99)(?:\.0+)?%\s+(\S+)\s*$", output, re.M)
    }
    lat = re.search(r"^\s+Latency\s+(\S+)\s+(\S+)\s+(\S+)", output, re.M)
    errs = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    # with no answer wrk prints a distribution of zeros: no latency was measured
    latency: dict[str, float | None] = {
        k: dist.get(k) if requests else None for k in ("p50", "p90", "p99")
    }
    latency["mean"] = _ms(lat.group(1)) if lat and requests else None
    latency["max"] = _ms(lat.group(3)) if lat and requests else None
    return WrkResult(
        requests=requests,
        duration_s=duration_s,
        non_2xx=int(non2xx.group(1)) if non2xx else 0,
        socket_errors=dict(zip(ERROR_KINDS, map(int, errs.groups()), strict=True))
        if errs
        else dict.fromkeys(ERROR_KINDS, 0),
        latency_ms=latency,
        source="text",
    )


def command(
    url: str,
    body: Path,
    connections: int,
    duration_s: float,
    threads: int,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> list[str]:
    """wrk's argv; `headers` (a binary body's Content-Type, X-Shape, X-Dtype) go to post.lua."""
    hdrs = dict(headers or {})
    content_type = hdrs.pop("Content-Type", "application/json")
    return [
        "wrk",
        "-t",
        str(max(1, min(threads, connections))),  # wrk needs connections >= threads
        "-c",
        str(connections),
        "-d",
        f"{max(1, math.ceil(duration_s))}s",  # wrk takes whole seconds only
        "--timeout",
        f"{timeout_s:g}s",
        "--latency",
        "-s",
        str(LUA),
        url,
        "--",
        str(body),
        *([content_type, *(f"{k}: {v}" for k, v in hdrs.items())] if headers else []),
    ]


def run(
    url: str,
    body: Path,
    connections: int,
    duration_s: float,
    threads: int = 2,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
) -> tuple[WrkResult, str]:
    """-> (result, wrk's stdout). A socket timeout is `timeout_s`, far above any answer we
    expect, so a slow answer is measured rather than dropped (wrk's default is 2 s)."""
    cmd = command(url, body, connections, duration_s, threads, timeout_s, headers)
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30
        )
    except FileNotFoundError:
        raise WrkError("wrk is not installed (Debian: apt-get install wrk)") from None
    except subprocess.TimeoutExpired:
        raise WrkError(f"wrk did not finish: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise WrkError(
            f"wrk exited {proc.returncode}: {proc.stderr.strip() or proc.stdout[-1000:]}"
        )
    return parse(proc.stdout), proc.stdout
