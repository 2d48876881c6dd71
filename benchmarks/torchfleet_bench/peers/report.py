"""From the raw runs of the peer benchmark to the figures it reports, and the table it prints.

A *run* is one server process (one repetition of one server in one thread setting) and holds a
result per concurrency level. Runs of the same server and setting are grouped by their `key`
("torchfleet", "mosec@omp1", ...). Every figure is the median over repetitions, with min and
max beside it: the build machine is shared and noisy, and the median of 3 is what the README
tells readers to compare. Pure functions of dicts, so the tests feed them recorded runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

OURS = "torchfleet"


def _ratio_cell(per_c: dict, c: int) -> str:
    """'0.54 vs torchserve' for a concurrency the run measured, else '-'."""
    if str(c) not in per_c:
        return "-"
    return _fmt(per_c[str(c)]["ratio"], ".2f") + " vs " + str(per_c[str(c)]["best_peer"])


def stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """median/min/max/n over the values that exist (a failed repetition gives None)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
        "n": len(xs),
    }


def run_key(server: str, threads: str) -> str:
    return server if threads == "default" else f"{server}@omp{threads}"


def split_key(key: str) -> tuple[str, str]:
    server, _, threads = key.partition("@omp")
    return server, threads or "default"


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{key: {levels: {c: {req_per_s, p50_ms, p99_ms, cpu_ms_per_req: stats, errors: total}},
    start_to_ready_s, first_request_ms, first_over_steady_p50, first_over_fresh, peak_rss_mb,
    peak_pss_mb: stats, repetitions, failures}}"""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault(run["key"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for key, group in grouped.items():
        ok = [r for r in group if not r.get("error")]
        concs = sorted({lv["concurrency"] for r in ok for lv in r.get("levels", [])})
        levels = {}
        for c in concs:
            at_c = [lv for r in ok for lv in r["levels"] if lv["concurrency"] == c]
            levels[str(c)] = {
                "req_per_s": stats(lv["req_per_s"] for lv in at_c),
                "p50_ms": stats(lv["latency_ms"]["p50"] for lv in at_c),
                "p99_ms": stats(lv["latency_ms"]["p99"] for lv in at_c),
                "cpu_ms_per_req": stats(lv.get("cpu_ms_per_req") for lv in at_c),
                "errors": sum(lv["errors"] for lv in at_c),
                "non_2xx": sum(lv["non_2xx"] for lv in at_c),
                "underfilled": sum(1 for lv in at_c if lv.get("underfilled")),
            }
        out[key] = {
            "levels": levels,
            "start_to_ready_s": stats(r.get("start_to_ready_s") for r in ok),
            "first_request_ms": stats(r.get("first_request_ms") for r in ok),
            "first_over_steady_p50": stats(first_over_p50(r) for r in ok),
            "first_over_fresh": stats(first_over_fresh(r) for r in ok),
            "peak_rss_mb": stats(r.get("peak_rss_mb") for r in ok),
            "peak_pss_mb": stats(r.get("peak_pss_mb") for r in ok),
            "processes": max((r.get("processes", 0) for r in ok), default=0),
            "sigterm_to_exit_s": stats(r.get("sigterm_to_exit_s") for r in ok),
            "repetitions": len(ok),
            "failures": [r["error"] for r in group if r.get("error")],
        }
    return out


def first_over_p50(run: dict[str, Any]) -> float | None:
    """The first request after ready over the same run's steady p50 at one client."""
    first = run.get("first_request_ms")
    p50 = next(
        (lv["latency_ms"]["p50"] for lv in run.get("levels", []) if lv["concurrency"] == 1), None
    )
    return round(first / p50, 3) if first and p50 else None


def first_over_fresh(run: dict[str, Any]) -> float | None:
    """The first request after ready over the median of the same client's next requests, each
    on a fresh connection too (`fresh_ms`): what the server's first answer costs extra."""
    first, fresh = run.get("first_request_ms"), run.get("fresh_ms")
    return round(first / statistics.median(fresh), 3) if first and fresh else None


def _median(summary: dict[str, Any], key: str, c: str, figure: str = "req_per_s") -> float | None:
    return summary.get(key, {}).get("levels", {}).get(c, {}).get(figure, {}).get("median")


def ratios(
    summary: dict[str, dict[str, Any]],
    offline: dict[str, float],
    ours_offline: dict[str, float] | None = None,
    ours: str = OURS,
) -> dict[str, Any]:
    """torchfleet / best peer (by median req/s) per thread setting and level, and served /
    offline per key and level. `offline` maps a thread setting to the file's best items/s (what
    the peers run), `ours_offline` to that of the graph torchfleet serves (its optimiser's)."""
    out: dict[str, Any] = {"ours_over_best_peer": {}, "served_over_offline": {}}
    settings = sorted({split_key(k)[1] for k in summary}, key=lambda t: (t != "default", t))
    for threads in settings:
        mine = run_key(ours, threads)
        peers = [k for k in summary if split_key(k)[1] == threads and k != mine]
        per_c = {}
        for c in summary.get(mine, {}).get("levels", {}):
            ranked = sorted(
                ((_median(summary, k, c), k) for k in peers if _median(summary, k, c)),
                reverse=True,
            )
            ours_rps = _median(summary, mine, c)
            best_rps, best = ranked[0] if ranked else (None, None)
            per_c[c] = {
                "ratio": round(ours_rps / best_rps, 3) if ours_rps and best_rps else None,
                "best_peer": split_key(best)[0] if best else None,
                "best_peer_req_per_s": best_rps,
                "ranking": [
                    split_key(k)[0]
                    for _, k in sorted(
                        ((_median(summary, k, c) or 0.0, k) for k in [mine, *peers]), reverse=True
                    )
                ],
            }
        out["ours_over_best_peer"][threads] = per_c
    for key, s in summary.items():
        server, threads = split_key(key)
        ceiling = ((ours_offline or {}) if server == ours else offline).get(threads)
        out["served_over_offline"][key] = {
            c: (
                round(lv["req_per_s"]["median"] / ceiling, 3)
                if ceiling and lv["req_per_s"]["median"]
                else None
            )
            for c, lv in s["levels"].items()
        }
    return out


def ranking_changes(rat: dict[str, Any]) -> dict[str, bool]:
    """Per level: does OMP_NUM_THREADS=1 order the servers differently from the defaults?"""
    base, one = (
        rat["ours_over_best_peer"].get("default", {}),
        rat["ours_over_best_peer"].get("1", {}),
    )
    return {c: base[c]["ranking"] != one[c]["ranking"] for c in one if c in base}


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _cell(s: dict[str, Any] | None, spec: str = ".1f") -> str:
    """median [min-max] of a stats dict."""
    if not s or s.get("median") is None:
        return "-"
    if s["n"] > 1:
        return f"{s['median']:{spec}} [{s['min']:{spec}}-{s['max']:{spec}}]"
    return f"{s['median']:{spec}}"


def render(
    summary: dict[str, dict[str, Any]],
    rat: dict[str, Any],
    title: str,
    ours: str = OURS,
) -> str:
    """The table `make bench-peers` prints: one block per figure, one row per server (and thread
    setting), one column per concurrency level."""
    keys = sorted(summary, key=lambda k: (split_key(k)[1] != "default", split_key(k)[0] != ours, k))
    concs = sorted({int(c) for s in summary.values() for c in s["levels"]})
    width = max([len(k) for k in keys] + [18]) + 2
    colw = 24
    head = f"{'':<{width}}" + "".join(f"{'c=' + str(c):>{colw}}" for c in concs)
    lines = [title, ""]

    def block(label: str, cell: Any) -> None:
        lines.append(label)
        lines.append(head)
        for k in keys:
            lines.append(
                f"  {k:<{width - 2}}" + "".join(f"{cell(k, str(c)):>{colw}}" for c in concs)
            )
        lines.append("")

    def level(figure: str, spec: str = ".1f") -> Any:
        return lambda k, c: _cell(summary[k]["levels"].get(c, {}).get(figure), spec)

    block("req/s, median [min-max] of the repetitions", level("req_per_s"))
    lines.append(f"{ours} / best peer (by median req/s)")
    lines.append(head)
    for threads, per_c in rat["ours_over_best_peer"].items():
        name = "default threads" if threads == "default" else f"OMP_NUM_THREADS={threads}"
        lines.append(
            f"  {name:<{width - 2}}" + "".join(f"{_ratio_cell(per_c, c):>{colw}}" for c in concs)
        )
    lines.append("")
    block("p50 ms", level("p50_ms"))
    block("p99 ms", level("p99_ms"))
    block("server CPU ms per request (whole process tree)", level("cpu_ms_per_req", ".2f"))
    block(
        "errors (non-2xx + socket errors, all repetitions)",
        lambda k, c: str(summary[k]["levels"].get(c, {}).get("errors", "-")),
    )
    short = [
        f"{k} c={c} ({lv['underfilled']}x)"
        for k in keys
        for c, lv in summary[k]["levels"].items()
        if lv.get("underfilled")
    ]
    if short:
        lines.append(
            "fewer answers than connections in the window (latency > duration; req/s is a floor): "
            + ", ".join(short)
        )
        lines.append("")
    lines.append("served / offline best (median req/s over the model's in-process items/s)")
    lines.append(head)
    for k in keys:
        row = rat["served_over_offline"].get(k, {})
        lines.append(
            f"  {k:<{width - 2}}"
            + "".join(f"{_fmt(row.get(str(c)), '.2f'):>{colw}}" for c in concs)
        )
    lines.append("")
    lines.append(
        f"{'':<{width}}{'peak RSS MB':>16}{'peak PSS MB':>16}{'procs':>7}{'start->ready s':>18}"
        f"{'first req ms':>16}{'first/p50':>12}{'first/next':>12}{'SIGTERM->exit s':>17}"
    )
    for k in keys:
        s = summary[k]
        lines.append(
            f"  {k:<{width - 2}}{_fmt(s['peak_rss_mb']['max'], '.0f'):>16}{_fmt(s['peak_pss_mb']['max'], '.0f'):>16}"
            f"{s['processes']:>7}{_fmt(s['start_to_ready_s']['median'], '.2f'):>18}"
            f"{_fmt(s['first_request_ms']['median'], '.1f'):>16}{_fmt(s['first_over_steady_p50']['median'], '.2f'):>12}"
            f"{_fmt(s['first_over_fresh']['median'], '.2f'):>12}"
            f"{_fmt(s['sigterm_to_exit_s']['median'], '.2f'):>17}"
        )
        for failure in s["failures"]:
            lines.append(f"    FAILED: {failure}")
    return "\n".join(lines)
