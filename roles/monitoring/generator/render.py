"""Draw the generated dashboard with matplotlib from real Prometheus query results, laid out
by each panel's gridPos (Grafana cannot run on the machine that produces the docs' picture).

Contract: `render(board, fetch, out, caption)` where `board` is the dashboard dict of
dashboard.build(), `fetch(expr)` returns one panel target's range result as a list of
(legend-ready labels, [(unix_seconds, value), ...]) and `out` is the PNG written. Stat panels
show each series' last value; time series are drawn stacked where the panel stacks; tables
list the label sets. Only used on a developer machine (matplotlib is a bench requirement).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

Series = tuple[dict[str, str], list[tuple[float, float]]]
Fetch = Callable[[str], list[Series]]

ROW_UNIT_IN = 0.34  # inches per gridPos height unit
WIDTH_IN = 20.0


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "NaN"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "percentunit":
        return f"{value * 100:.2f} %"
    if unit == "reqps":
        return f"{value:.1f} req/s"
    if unit == "currencyUSD":
        return f"${value:.2f}/h"
    return f"{value:.3g}"


def _legend(fmt: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) if fmt else ""
    return text.strip() or ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"


def _panel_series(
    panel: dict[str, Any], fetch: Fetch
) -> list[tuple[str, list[tuple[float, float]]]]:
    out = []
    for target in panel.get("targets", []):
        for labels, points in fetch(target["expr"]):
            out.append((_legend(target.get("legendFormat", ""), labels), points))
    return out


def _thresholds(panel: dict[str, Any]) -> list[float]:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [s["value"] for s in steps if s.get("value") is not None]


def _draw_timeseries(ax: Any, panel: dict[str, Any], series: list, unit: str) -> None:
    stacking = (
        panel.get("fieldConfig", {})
        .get("defaults", {})
        .get("custom", {})
        .get("stacking", {})
        .get("mode", "none")
    )
    if stacking in ("normal", "percent") and series:
        times = sorted({t for _, pts in series for t, _ in pts})
        rows = [[dict(pts).get(t, 0.0) for t in times] for _, pts in series]
        if stacking == "percent":
            totals = [sum(col) or 1.0 for col in zip(*rows, strict=True)]
            rows = [[v / tot for v, tot in zip(row, totals, strict=True)] for row in rows]
        ax.stackplot(
            [datetime.fromtimestamp(t) for t in times],
            rows,
            labels=[name for name, _ in series],
            alpha=0.75,
        )
    else:
        for name, pts in series:
            ax.plot(
                [datetime.fromtimestamp(t) for t, _ in pts], [v for _, v in pts], label=name, lw=1.3
            )
    for value in _thresholds(panel):
        ax.axhline(value, color="tab:red", ls="--", lw=1)
    minimum = panel.get("fieldConfig", {}).get("defaults", {}).get("min")
    if minimum is not None:
        ax.set_ylim(bottom=minimum)
    if not series:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="grey", transform=ax.transAxes)
    ax.yaxis.set_major_formatter(lambda v, _pos: _fmt(v, unit))
    ax.tick_params(labelsize=7)
    from matplotlib.dates import DateFormatter

    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S"))
    if series:
        ax.legend(fontsize=6, loc="upper left", ncol=3, framealpha=0.6)
    ax.grid(alpha=0.3)


def render(board: dict[str, Any], fetch: Fetch, out: Path, caption: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = board["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(WIDTH_IN, bottom * ROW_UNIT_IN + 1.2))
    grid = fig.add_gridspec(
        bottom,
        24,
        hspace=3.5,
        wspace=1.6,
        top=1 - 0.9 / fig.get_figheight(),
        bottom=0.5 / fig.get_figheight(),
        left=0.03,
        right=0.99,
    )
    fig.suptitle(f"{board['title']} — {caption}", fontsize=12, x=0.01, ha="left")
    for panel in panels:
        pos = panel["gridPos"]
        if panel["type"] == "row":
            ax = fig.add_subplot(grid[pos["y"] : pos["y"] + 1, :])
            ax.axis("off")
            ax.text(0, 0.2, panel["title"], fontsize=11, weight="bold", transform=ax.transAxes)
            continue
        # Tall panels leave a unit above (title) and below (tick labels) free.
        top, bottom_row = (
            (pos["y"] + 1, pos["y"] + pos["h"] - 1)
            if pos["h"] > 4
            else (pos["y"], pos["y"] + pos["h"])
        )
        ax = fig.add_subplot(grid[top:bottom_row, pos["x"] : pos["x"] + pos["w"]])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = _panel_series(panel, fetch)
        ax.set_title(panel["title"], fontsize=9, loc="left")
        if panel["type"] == "stat":
            ax.axis("off")
            limit = (_thresholds(panel) or [math.inf])[0]
            lines = [(name, pts[-1][1]) for name, pts in series if pts]
            text = "\n".join(
                (f"{name}: " if len(lines) > 1 else "") + _fmt(v, unit) for name, v in lines
            )
            color = "tab:red" if any(v >= limit for _, v in lines) else "tab:green"
            ax.text(
                0.5,
                0.4,
                text or "no data",
                ha="center",
                va="center",
                color=color,
                fontsize=16 if len(lines) <= 1 else 11,
                weight="bold",
                transform=ax.transAxes,
            )
        elif panel["type"] == "table":
            ax.axis("off")
            rows = [name for name, _ in series] or ["no data"]
            ax.text(
                0.01,
                0.85,
                "\n".join(rows),
                va="top",
                family="monospace",
                fontsize=8,
                transform=ax.transAxes,
            )
        else:
            _draw_timeseries(ax, panel, series, unit)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
