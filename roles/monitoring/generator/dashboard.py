"""The torchfleet Grafana dashboard, built with grafana-foundation-sdk (Grafana's own
dashboards-as-code library; the pinned 11.6 build emits the dashboard JSON model that Grafana
11 and 12 load through file provisioning).

Contract: `build()` returns the dashboard as a JSON-ready dict. Every panel queries the
Prometheus data source provisioned with uid `DATASOURCE_UID` and reads the recording rules of
roles/monitoring/files/rules/ (or raw metrics where no aggregation is needed). Queries use the
template variables `$stack` and `$node` (multi-value, "All" = `.*`), always as `=~"$var"`.
The live test runs every target of every panel against a real Prometheus, so a panel with a
misspelt series fails there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

UID = "torchfleet-fleet"
TITLE = "torchfleet fleet"
DATASOURCE_UID = "torchfleet-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
GRID_WIDTH = 24

S = 'stack=~"$stack"'
SN = 'stack=~"$stack", node=~"$node"'


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # stat | timeseries | table
    targets: tuple[Target, ...]
    unit: str = "short"
    width: int = 8
    height: int = 8
    description: str = ""
    stacking: str = "none"  # none | normal | percent
    threshold: float | None = None  # drawn as a red line / turns a stat red
    minimum: float | None = 0


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...] = field(default_factory=tuple)


ROWS: tuple[RowSpec, ...] = (
    RowSpec(
        "Fleet",
        (
            PanelSpec(
                "Ready nodes",
                "stat",
                (Target(f"sum(node:torchfleet_serving:bool{{{S}}})"),),
                width=4,
                height=4,
                description="Nodes whose runtime is warmed up and not draining.",
            ),
            PanelSpec(
                "Nodes by lifecycle",
                "stat",
                (
                    Target(
                        f"sum by (lifecycle) (stack_lifecycle:torchfleet_nodes:count{{{S}}})",
                        "{{lifecycle}}",
                    ),
                ),
                width=4,
                height=4,
                description="Discovered nodes, spot and on-demand.",
            ),
            PanelSpec(
                "Estimated cost",
                "stat",
                (Target(f"sum(stack:torchfleet_cost_usd_per_hour:estimate{{{S}}})"),),
                unit="currencyUSD",
                width=4,
                height=4,
                description="USD per hour: each discovered node at its instance type's "
                "reference price (compat/catalog.yml); spot at the family's typical "
                "spot ratio. An estimate, not a bill.",
            ),
            PanelSpec(
                "Throughput",
                "stat",
                (Target(f"sum(stack:torchfleet_requests:rate1m{{{S}}})"),),
                unit="reqps",
                width=4,
                height=4,
            ),
            PanelSpec(
                "p99 latency",
                "stat",
                (Target(f"max(stack:torchfleet_request_duration_seconds:p99_rate1m{{{S}}})"),),
                unit="s",
                width=4,
                height=4,
                threshold=0.2,
            ),
            PanelSpec(
                "Error ratio (1 h)",
                "stat",
                (Target(f"max(stack:torchfleet_request_errors:ratio_rate1h{{{S}}})"),),
                unit="percentunit",
                width=4,
                height=4,
                threshold=0.001,
                description="Share of prediction requests answered with a 5xx. SLO: 0.1 %.",
            ),
        ),
    ),
    RowSpec(
        "Traffic and latency",
        (
            PanelSpec(
                "Throughput per node",
                "timeseries",
                (Target(f"node:torchfleet_requests:rate1m{{{SN}}}", "{{node}}"),),
                unit="reqps",
                stacking="normal",
            ),
            PanelSpec(
                "Latency percentiles",
                "timeseries",
                (
                    Target(
                        f"stack:torchfleet_request_duration_seconds:p50_rate1m{{{S}}}",
                        "p50 {{stack}}",
                    ),
                    Target(
                        f"stack:torchfleet_request_duration_seconds:p90_rate1m{{{S}}}",
                        "p90 {{stack}}",
                    ),
                    Target(
                        f"stack:torchfleet_request_duration_seconds:p99_rate1m{{{S}}}",
                        "p99 {{stack}}",
                    ),
                ),
                unit="s",
                threshold=0.2,
                description="Arrival to answer. The red line is the 200 ms p99 objective.",
            ),
            PanelSpec(
                "Error ratio by window",
                "timeseries",
                (
                    Target(f"stack:torchfleet_request_errors:ratio_rate5m{{{S}}}", "5m {{stack}}"),
                    Target(f"stack:torchfleet_request_errors:ratio_rate1h{{{S}}}", "1h {{stack}}"),
                    Target(f"stack:torchfleet_request_errors:ratio_rate6h{{{S}}}", "6h {{stack}}"),
                ),
                unit="percentunit",
                threshold=0.001,
                description="The burn-rate alerts' windows. The red line is the 0.1 % error budget.",
            ),
        ),
    ),
    RowSpec(
        "Routes",
        (
            PanelSpec(
                "Throughput by route",
                "timeseries",
                (Target(f"stack_route:torchfleet_requests:rate1m{{{S}}}", "{{route}}"),),
                unit="reqps",
                stacking="normal",
                width=12,
                description="Prediction requests per second by route: /v1/predict, and the Open "
                "Inference Protocol's /v2/models/:model/infer (Triton and KServe clients).",
            ),
            PanelSpec(
                "p99 latency by route",
                "timeseries",
                (
                    Target(
                        f"stack_route:torchfleet_request_duration_seconds:p99_rate1m{{{S}}}",
                        "{{route}}",
                    ),
                ),
                unit="s",
                threshold=0.2,
                width=12,
                description="Arrival to answer, per route. The red line is the 200 ms p99 "
                "objective.",
            ),
        ),
    ),
    RowSpec(
        "Where request time goes",
        (
            PanelSpec(
                "Mean time per stage",
                "timeseries",
                (
                    Target(
                        f"stack_stage:torchfleet_stage_duration_seconds:mean_rate1m{{{S}}}",
                        "{{stage}}",
                    ),
                ),
                unit="s",
                stacking="normal",
                description="Stacked: decode + queue + model (per batch run) + encode + write.",
            ),
            PanelSpec(
                "Share of request time",
                "timeseries",
                (
                    Target(
                        f"stack_stage:torchfleet_stage_duration_seconds:share_rate1m{{{S}}}",
                        "{{stage}}",
                    ),
                ),
                unit="percentunit",
                stacking="percent",
                description="Each stage's share of a request's time: the first place to look "
                "when latency moves.",
            ),
            PanelSpec(
                "p99 per stage",
                "timeseries",
                (
                    Target(
                        f"stack_stage:torchfleet_stage_duration_seconds:p99_rate1m{{{S}}}",
                        "{{stage}}",
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    RowSpec(
        "Batching and models",
        (
            PanelSpec(
                "Batch size",
                "timeseries",
                (
                    Target(f"stack:torchfleet_batch_size:mean_rate1m{{{S}}}", "mean {{stack}}"),
                    Target(f"torchfleet_max_batch_size{{{SN}}}", "cap {{node}}"),
                ),
                description="Instances per model run (before padding to a warmed bucket) against "
                "each node's batch cap.",
            ),
            PanelSpec(
                "Queue depth and requests in flight",
                "timeseries",
                (
                    Target(f"torchfleet_queue_depth{{{SN}}}", "queued {{node}}"),
                    Target(f"torchfleet_inflight_requests{{{SN}}}", "in flight {{node}}"),
                ),
            ),
            PanelSpec(
                "Model on each node",
                "table",
                (
                    Target(
                        f"torchfleet_model_info{{{SN}}}",
                        "{{node}}  {{model_name}} {{model_version}}  {{format}} {{device}} {{precision}}",
                    ),
                ),
                width=24,
                height=5,
                description="torchfleet_model_info: version, name, format, device, precision.",
            ),
        ),
    ),
    RowSpec(
        "Versions compared",
        (
            PanelSpec(
                "Share of requests by model version",
                "timeseries",
                (
                    Target(
                        f"stack_version:torchfleet_requests:share_rate1m{{{S}}}",
                        "{{model_version}}",
                    ),
                ),
                unit="percentunit",
                width=6,
                stacking="percent",
                description="The split an A/B or a canary holds (torchfleet rollout, the "
                "stack's rollout.candidate_weight, HAProxy weights).",
            ),
            PanelSpec(
                "5xx ratio by model version",
                "timeseries",
                (
                    Target(
                        f"stack_version:torchfleet_request_errors:ratio_rate5m{{{S}}}",
                        "{{model_version}}",
                    ),
                ),
                unit="percentunit",
                width=6,
                threshold=0.001,
                description="Each version's errors over 5 minutes: the rollout's error guard "
                "compares the candidate with the stable version the same way.",
            ),
            PanelSpec(
                "p99 latency by model version",
                "timeseries",
                (
                    Target(
                        f"stack_version:torchfleet_request_duration_seconds:p99_rate1m{{{S}}}",
                        "{{model_version}}",
                    ),
                ),
                unit="s",
                threshold=0.2,
                width=6,
                description="Compare a new model version with the one it replaces: the "
                "runtime's latency buckets resolve a 1.2x change from 5 ms to 5 s.",
            ),
            PanelSpec(
                "Capacity per node by model version",
                "timeseries",
                (
                    Target(
                        f"stack_version:torchfleet_capacity_items_per_second:avg{{{S}}}",
                        "{{model_version}}",
                    ),
                ),
                width=6,
                description="Instances per second one node sustains at its batch cap (measured "
                "at warm-up): the rollout's capacity guard compares the candidate with the "
                "stable version the same way.",
            ),
        ),
    ),
    RowSpec(
        "GPU",
        (
            PanelSpec(
                "GPU utilisation",
                "timeseries",
                (Target(f"torchfleet_node_gpu_utilization_ratio{{{SN}}}", "{{node}} gpu{{gpu}}"),),
                unit="percentunit",
                width=12,
                threshold=0.7,
                description="nvidia-smi, whole GPU (node exporter textfile). Alert under 70 % "
                "while requests queue.",
            ),
            PanelSpec(
                "GPU memory used",
                "timeseries",
                (
                    Target(
                        f"node_gpu:torchfleet_node_gpu_memory_used:ratio{{{SN}}}",
                        "{{node}} gpu{{gpu}}",
                    ),
                ),
                unit="percentunit",
                width=12,
                description="Used / total per GPU (nvidia-smi). The runtime fills a GPU up to "
                "its memory_fraction on purpose: the memory alerts are in the next row.",
            ),
        ),
    ),
    RowSpec(
        "One node",
        (
            PanelSpec(
                "p99 against a day earlier",
                "timeseries",
                (
                    Target(
                        f"node:torchfleet_request_duration_seconds:p99_rate5m{{{SN}}}",
                        "{{node}} now",
                    ),
                    Target(
                        f"node:torchfleet_request_duration_seconds:p99_rate5m{{{SN}}} offset 1d",
                        "{{node}} a day earlier",
                    ),
                ),
                unit="s",
                description="TorchfleetLatencySpike fires when now is 20 % above a day earlier "
                "for 10 min. Pick the node in the Node variable.",
            ),
            PanelSpec(
                "Mean time per stage, now and a day earlier",
                "timeseries",
                (
                    Target(
                        f"node_stage:torchfleet_stage_duration_seconds:mean_rate5m{{{SN}}}",
                        "{{node}} {{stage}}",
                    ),
                    Target(
                        f"node_stage:torchfleet_stage_duration_seconds:mean_rate5m{{{SN}}} "
                        "offset 1d",
                        "{{node}} {{stage}} a day earlier",
                    ),
                ),
                unit="s",
                description="The stage that grew is where the spike comes from.",
            ),
            PanelSpec(
                "Replica busy share",
                "timeseries",
                (
                    Target(
                        f"node_device:torchfleet_replica_busy:ratio_rate5m{{{SN}}}",
                        "{{node}} {{device}}",
                    ),
                ),
                unit="percentunit",
                description="Seconds each model replica spent running batches, per second.",
            ),
            PanelSpec(
                "CUDA allocator: reserved share and the sizing",
                "timeseries",
                (
                    Target(
                        f"node_device:torchfleet_cuda_memory_reserved:ratio{{{SN}}}",
                        "{{node}} {{device}} reserved",
                    ),
                    Target(f"torchfleet_memory_fraction{{{SN}}}", "{{node}} {{device}} sizing"),
                ),
                unit="percentunit",
                description="TorchfleetGpuMemoryAboveSizing: reserved over the sizing + 5 points "
                "for 10 min.",
            ),
            PanelSpec(
                "CUDA allocator: fragmentation",
                "timeseries",
                (
                    Target(
                        f"node_device:torchfleet_cuda_memory_fragmentation:ratio{{{SN}}}",
                        "{{node}} {{device}}",
                    ),
                ),
                unit="percentunit",
                threshold=0.3,
                description="Inactive split bytes / reserved. Alert over 30 % for 15 min.",
            ),
            PanelSpec(
                "CUDA allocator: retries and OOMs (10 min)",
                "timeseries",
                (
                    Target(
                        f"sum by (node, device) (increase(torchfleet_cuda_alloc_retries_total{{{SN}}}[10m]))",
                        "{{node}} {{device}} retries",
                    ),
                    Target(
                        f"sum by (node, device) (increase(torchfleet_cuda_ooms_total{{{SN}}}[10m]))",
                        "{{node}} {{device}} OOMs",
                    ),
                ),
                description="Any retry stalls a batch; an OOM lowers the node's batch cap.",
            ),
        ),
    ),
    RowSpec(
        "Capacity and cost",
        (
            PanelSpec(
                "Spot and on-demand nodes",
                "timeseries",
                (
                    Target(
                        f"sum by (lifecycle) (stack_lifecycle:torchfleet_nodes:count{{{S}}})",
                        "{{lifecycle}}",
                    ),
                ),
                stacking="normal",
            ),
            PanelSpec(
                "Ready nodes over time",
                "timeseries",
                (Target(f"sum by (stack) (node:torchfleet_serving:bool{{{S}}})", "{{stack}}"),),
            ),
            PanelSpec(
                "Estimated cost per hour",
                "timeseries",
                (Target(f"stack:torchfleet_cost_usd_per_hour:estimate{{{S}}}", "{{stack}}"),),
                unit="currencyUSD",
            ),
            PanelSpec(
                "Measured spend per day beside the estimate",
                "timeseries",
                (
                    Target(
                        f"torchfleet_spend_last_day{{{S}}}",
                        "measured, last whole UTC day ({{stack}}, {{currency}})",
                    ),
                    Target(
                        f"stack:torchfleet_cost_usd:estimate_24h{{{S}}}",
                        "estimated, last 24 h ({{stack}}, USD)",
                    ),
                ),
                width=24,
                description="Measured: the cloud's bill by the stack tag (Cost Explorer or "
                "BSS, read by the torchfleet-spend exporter a few times a day; the bill lags "
                "up to a day, in the account's currency), the whole bill: nodes, load "
                "balancers, NAT, disks, buckets. Estimated: the nodes' hourly estimate "
                "summed over the last 24 h, in USD; `torchfleet cost` sets the whole bill's "
                "estimate beside the measured spend.",
            ),
        ),
    ),
)


def _thresholds(value: float | None) -> dashboard.ThresholdsConfig:
    steps = [Threshold(value=None, color="green")]
    if value is not None:
        steps.append(Threshold(value=value, color="red"))
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(spec: PanelSpec, panel_id: int, pos: GridPos) -> Any:
    builder: Any
    if spec.kind == "stat":
        builder = (
            stat.Panel()
            .graph_mode(common_models.BigValueGraphMode.AREA)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        )
    elif spec.kind == "table":
        builder = table.Panel()
    else:
        builder = (
            timeseries.Panel()
            .line_width(1)
            .fill_opacity(10 if spec.stacking == "none" else 60)
            .legend(
                common.VizLegendOptions()
                .show_legend(True)
                .display_mode(common_models.LegendDisplayMode.LIST)
                .placement(common_models.LegendPlacement.BOTTOM)
            )
            .stacking(common.StackingConfig().mode(common_models.StackingMode(spec.stacking)))
        )
        if spec.threshold is not None:
            builder = builder.thresholds_style(
                common.GraphThresholdsStyleConfig().mode(
                    common_models.GraphThresholdsStyleMode.DASHED
                )
            )
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .grid_pos(pos)
        .thresholds(_thresholds(spec.threshold))
    )
    if spec.description:
        builder = builder.description(spec.description)
    if spec.minimum is not None and spec.kind == "timeseries":
        builder = builder.min(spec.minimum)
    for i, target in enumerate(spec.targets):
        query = (
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + i))
            .expr(target.expr)
            .datasource(DATASOURCE)
        )
        if target.legend:
            query = query.legend_format(target.legend)
        if spec.kind == "table":
            query = query.instant().format(PromQueryFormat.TABLE)
        builder = builder.with_target(query)
    return builder


def _variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def build() -> dict[str, Any]:
    board = (
        dashboard.Dashboard(TITLE)
        .uid(UID)
        .description(
            "torchfleet serving fleet: traffic, latency and where it goes, errors "
            "against the SLO, batching, GPUs, capacity and cost."
        )
        .tags(["torchfleet", "inference", "gpu"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            _variable("stack", "Stack", 'label_values(up{job="torchfleet-runtime"}, stack)')
        )
        .with_variable(
            _variable(
                "node", "Node", 'label_values(up{job="torchfleet-runtime", stack=~"$stack"}, node)'
            )
        )
    )
    panel_id, y = 1, 0
    for row in ROWS:
        board = board.with_row(
            dashboard.Row(row.title).id(panel_id).grid_pos(GridPos(h=1, w=GRID_WIDTH, x=0, y=y))
        )
        panel_id, y = panel_id + 1, y + 1
        x, row_height = 0, 0
        for spec in row.panels:
            if x + spec.width > GRID_WIDTH:
                x, y, row_height = 0, y + row_height, 0
            board = board.with_panel(
                _panel(spec, panel_id, GridPos(h=spec.height, w=spec.width, x=x, y=y))
            )
            panel_id += 1
            x += spec.width
            row_height = max(row_height, spec.height)
        y += row_height
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render_json() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"
