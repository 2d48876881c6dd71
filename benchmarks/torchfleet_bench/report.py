"""What every benchmark report records and draws: the host it ran on, and the latency and
throughput plot of a load run (matplotlib, imported only when a plot is asked for).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
from pathlib import Path
from typing import Any

from torchfleet_bench import BenchError
from torchfleet_bench.levels import PERCENTILES


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
