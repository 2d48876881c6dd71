"""Per-model-version figures of one evaluation window: requests, 5xx, p99, shadow agreement.

Contract. A source has `begin()` (the window opens) and `end() -> {version: Figures}` (the
figures of the seconds since `begin`, by `model_version`), so the stable and the candidate are
compared over the same seconds:
- `PrometheusSource(url, selector)`: the stack's Prometheus (the monitoring host). At `end` it
  asks for the increase of `torchfleet_requests_total` (all, and code 5xx) and the p99 of
  `torchfleet_request_duration_seconds` over the window, each joined with
  `torchfleet_model_info` for the version (the recording rule
  stack_version:torchfleet_request_duration_seconds:p99_rate1m does the same join);
- `ScrapeSource(nodes)`: where there is no Prometheus, the nodes' own /metrics read at both
  ends of the window; a node's figures go to the version it served at the end (the engine
  opens a new window after it switches a node, so a window never spans a switch).
- `CloudWatchSource(dimensions, versions, window_s, region)`: an AWS group stack without a
  Prometheus: its ALB's per-target-group metrics (namespace AWS/ApplicationELB, dimensions
  LoadBalancer + TargetGroup, the stack output ROLLOUT_METRICS_OUTPUT), one GetMetricData call
  per window: RequestCount (Sum), HTTPCode_Target_5XX_Count (Sum) and TargetResponseTime (p99)
  of each track's target group, a track's figures going to the version it serves (`versions`,
  read at `begin`). CloudWatch keeps these metrics in 1-minute periods and publishes a minute
  after it ends, so a window reads one period of its whole minutes (`cloudwatch_period`: a
  --window under 60 s is refused) ending `delay_s` (60) before `end`: the figures trail the
  window by about a minute. HTTPCode_ELB_5XX_Count (the ALB's own 5xx, such as a 502 from a
  node that reset the connection) has no TargetGroup dimension, so no version: not judged.
- `CloudMonitorSource(...)`: an Alibaba group stack without a Prometheus: the nodes' own
  RequestCount, ErrorCount and LatencyP99 (the node agent publishes them every 15 s, keyed by
  the node's scaling group: one per track) in the stack's CloudMonitor application group, read
  per track with DescribeMetricList over the same whole minutes as CloudWatch's (the CLB's own
  figures are per listener, the same for both tracks). Any node can write any custom metric
  (CloudMonitor scopes PutCustomMetric to nothing: docs/security.md), so each window's totals
  are held against the CLB's own (InstanceQps, InstanceUpstreamCode5xx: `cross_check`); when
  they disagree the window raises SignalMismatch and the engine holds the split. Both are a
  `TrackMetricsSource`.
`quantile(q, buckets)` is Prometheus' histogram_quantile over cumulative buckets
(torchfleet_compat.histogram, the one rule the runtime and the node agent use too).

What a source can see (the engine asks before the first step, policy.p99_resolution):
`latency_bounds()` is the bucket bounds its p99s are read from: the nodes' own (ScrapeSource,
from the last scrape), the `le` values Prometheus holds, the runtime's LATENCY_BOUNDS for the
node agent's LatencyP99 (CloudMonitor), None for CloudWatch (the ALB's p99 is CloudWatch's own
percentile statistic, not a bucket reading). `recent(window_s)`, where a source has it, reads the
window just past without waiting (Prometheus, the clouds' published minutes); ScrapeSource has
none (a window is two scrapes). The capacity guard's figures, a node's instances/s at its batch
cap (`torchfleet_capacity_items_per_second`, averaged over a version's nodes) and its batch cap
(`torchfleet_max_batch_size`, the lowest), come from the nodes' /metrics and from Prometheus; the
clouds' per-track metrics carry none, so there the capacity guard judges nothing.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families
from torchfleet_compat.histogram import LATENCY_BOUNDS, quantile
from torchfleet_compat.problems import sentence

from infra import client
from infra.bootstrap.torchfleet_agent.metrics import (
    ERROR_COUNT_METRIC,
    LATENCY_P99_METRIC,
    REQUEST_COUNT_METRIC,
)
from infra.constants import ALB_NAMESPACE, ROLLOUT_METRICS_OUTPUT
from infra.rollout.errors import RolloutError
from infra.rollout.policy import Figures, RolloutSettingsError


class SignalError(RolloutError):
    """The figures could not be read (the message says from where and why)."""


class SignalMismatch(SignalError):
    """The figures were read but disagree with the load balancer's own, which no node can
    write: a node may be forging them. The engine holds the split instead of judging."""


class Source(Protocol):
    def begin(self) -> None: ...

    def end(self) -> dict[str, Figures]: ...


# version -> (instances compared, of which argmax agreed), cumulative, over the fleet
ShadowCounts = Callable[[], dict[str, tuple[float, float]]]


# --- the nodes' own /metrics -----------------------------------------------------------------


@dataclass
class Sample:
    """What one scrape of one node says: its version and the counters a window subtracts."""

    version: str = ""
    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    capacity: float = 0.0  # instances/s at the batch cap (0: not timed)
    batch_cap: int = 0
    shadow: dict[str, dict[str, float]] = field(default_factory=dict)  # version -> counters


def parse_metrics(text: str) -> Sample:
    s = Sample()
    for family in text_string_to_metric_families(text):
        for name, labels, value, *_ in family.samples:
            if name == "torchfleet_model_info" and value == 1:
                s.version = labels.get("model_version", "")
            elif name == "torchfleet_requests_total":
                s.requests += value
                if labels.get("code", "").startswith("5"):
                    s.errors += value
            elif name == "torchfleet_request_duration_seconds_bucket":  # summed over `route`
                le = float(labels["le"])
                s.buckets[le] = s.buckets.get(le, 0.0) + value
            elif name == "torchfleet_capacity_items_per_second":
                s.capacity = value
            elif name == "torchfleet_max_batch_size":
                s.batch_cap = int(value)
            elif name in (
                "torchfleet_shadow_instances_total",
                "torchfleet_shadow_argmax_agreements_total",
            ):
                key = "instances" if "instances" in name else "agreements"
                s.shadow.setdefault(labels.get("model_version", ""), {})[key] = value
    return s


def capacity_of(nodes: list[tuple[float, float]]) -> tuple[float | None, int | None]:
    """A version's (instances/s per node at its batch cap, the lowest batch cap) from its nodes'
    (capacity, cap); nodes that did not time their cap (capacity 0) are left out."""
    timed = [(c, cap) for c, cap in nodes if c > 0 and math.isfinite(c)]
    if not timed:
        return None, None
    return sum(c for c, _ in timed) / len(timed), int(min(cap for _, cap in timed))


class ScrapeSource:
    def __init__(self, urls: Callable[[], dict[str, str]], auth: client.Auth | None = None) -> None:
        self._urls = urls  # node name -> base URL, read at each end (nodes come and go)
        self._auth = auth or client.Auth()
        self._start: dict[str, Sample] = {}
        self._bounds: list[float] = []

    def latency_bounds(self) -> list[float]:
        """The latency buckets' bounds the nodes exposed at the last scrape."""
        return self._bounds

    def scrape(self) -> dict[str, Sample]:
        out = {}
        for name, url in self._urls().items():
            status, body, _ = client.request(
                "GET", url.rstrip("/") + "/metrics", timeout=5, auth=self._auth
            )
            if status != 200:
                raise SignalError(f"{name}: GET {url}/metrics answered {status}")
            out[name] = parse_metrics(body.decode())
            self._bounds = sorted(out[name].buckets) or self._bounds
        return out

    def begin(self) -> None:
        self._start = self.scrape()

    def end(self) -> dict[str, Figures]:
        now = self.scrape()
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for name, s in now.items():
            before = self._start.get(name)
            if before is None or s.requests < before.requests:  # new, or restarted
                before = Sample()
            totals[s.version][0] += s.requests - before.requests
            totals[s.version][1] += s.errors - before.errors
            for le, c in s.buckets.items():
                buckets[s.version][le] += c - before.buckets.get(le, 0.0)
        nodes: dict[str, list[Sample]] = defaultdict(list)
        for s in now.values():
            nodes[s.version].append(s)
        return {
            v: Figures(
                v,
                req,
                err,
                quantile(0.99, buckets[v].items()) if req else None,
                *capacity_of([(s.capacity, s.batch_cap) for s in nodes[v]]),
            )
            for v, (req, err) in totals.items()
        }

    def shadow(self) -> dict[str, tuple[float, float]]:
        """version -> (instances compared, argmax agreements), summed over the nodes, now."""
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for s in self.scrape().values():
            for v, c in s.shadow.items():
                out[v][0] += c.get("instances", 0.0)
                out[v][1] += c.get("agreements", 0.0)
        return {v: (a, b) for v, (a, b) in out.items()}


# --- Prometheus --------------------------------------------------------------------------------

# Each series joined with the version its instance serves now. torchfleet_model_info has one
# series per instance, but a Prometheus restarted on its old data keeps the version before a
# reload for up to 5 minutes (no staleness marker survives a restart), and a plain join then
# fails ("many-to-many matching not allowed"): the newest sample per instance wins. The
# recording rules use the same (roles/monitoring/files/rules/torchfleet-recording.rules.yml;
# tests/rollout/test_prometheus_join.py holds them equal).
CURRENT_VERSION = "(topk by (job, instance) (1, timestamp(torchfleet_model_info)) * 0 + 1)"
_JOIN = f"* on (job, instance) group_left (model_version) {CURRENT_VERSION}"


class PrometheusSource:
    def __init__(
        self, url: str, selector: str = "", clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url.rstrip("/")
        self.selector = selector  # e.g. 'stack="aws-dev"': which series are this stack's
        self._clock = clock
        self._start = 0.0

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        qs = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
        status, body, _ = client.request("GET", f"{self.url}/api/v1/query?{qs}", timeout=10)
        if status != 200:
            raise SignalError(f"Prometheus {self.url} answered {status} to {promql!r}")
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise SignalError(f"Prometheus {self.url}: {doc.get('error')} ({promql!r})")
        return list(doc["data"]["result"])

    def queries(self, window_s: float) -> dict[str, str]:
        w = f"{max(1, round(window_s))}s"
        sel = self.selector

        def counter(extra: str) -> str:
            labels = ",".join(x for x in (sel, extra) if x)
            return f"sum by (model_version) (increase(torchfleet_requests_total{{{labels}}}[{w}]) {_JOIN})"

        return {
            "requests": counter(""),
            "errors": counter('code=~"5.."'),
            "p99": (
                "histogram_quantile(0.99, sum by (model_version, le) ("
                f"rate(torchfleet_request_duration_seconds_bucket{{{sel}}}[{w}]) {_JOIN}))"
            ),
            "capacity": (
                "avg by (model_version) ("
                f"(torchfleet_capacity_items_per_second{{{sel}}} > 0) {_JOIN})"
            ),
            "batch_cap": (
                "min by (model_version) ("
                f"(torchfleet_max_batch_size{{{sel}}} and torchfleet_capacity_items_per_second"
                f"{{{sel}}} > 0) {_JOIN})"
            ),
        }

    def latency_bounds(self) -> list[float]:
        """The `le` bounds of the stack's request-latency buckets Prometheus holds now."""
        rows = self.query(
            f"count by (le) (torchfleet_request_duration_seconds_bucket{{{self.selector}}})",
            self._clock(),
        )
        return sorted(float(r["metric"]["le"]) for r in rows if "le" in r["metric"])

    def recent(self, window_s: float) -> dict[str, Figures]:
        """The figures of the `window_s` seconds just past (no waiting)."""
        self._start = self._clock() - window_s
        return self.end()

    def begin(self) -> None:
        self._start = self._clock()

    def shadow(self) -> dict[str, tuple[float, float]]:
        """version -> (instances compared, argmax agreements), cumulative over the stack."""
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        sel, now = f"{{{self.selector}}}", self._clock()
        for i, name in enumerate(
            ("torchfleet_shadow_instances_total", "torchfleet_shadow_argmax_agreements_total")
        ):
            for row in self.query(f"sum by (model_version) ({name}{sel})", now):
                out[row["metric"].get("model_version", "")][i] = float(row["value"][1])
        return {v: (a, b) for v, (a, b) in out.items()}

    def end(self) -> dict[str, Figures]:
        now = self._clock()
        got: dict[str, dict[str, float]] = defaultdict(dict)
        for key, promql in self.queries(now - self._start).items():
            for row in self.query(promql, now):
                value = float(row["value"][1])
                got[row["metric"].get("model_version", "")][key] = value
        return {
            v: Figures(
                v,
                f.get("requests", 0.0),
                f.get("errors", 0.0),
                f["p99"] if math.isfinite(f.get("p99", math.nan)) else None,
                f.get("capacity"),
                int(f["batch_cap"]) if "batch_cap" in f else None,
            )
            for v, f in got.items()
        }


# --- CloudWatch (an AWS group stack's ALB) ------------------------------------------------------

CLOUDWATCH_PERIOD_S = 60  # the ALB's metrics: 1-minute data points, nothing finer
CLOUDWATCH_DELAY_S = 60  # a minute is read this long after it ends (CloudWatch publishes late)
# metric -> (statistic, Figures field); one query of each per track's target group
ALB_METRICS = {
    "requests": ("RequestCount", "Sum"),
    "errors": ("HTTPCode_Target_5XX_Count", "Sum"),
    "p99": ("TargetResponseTime", "p99"),
}


def cloudwatch_period(window_s: float, service: str = "CloudWatch") -> int:
    """The metric period a window reads from a cloud's 1-minute metrics: its whole minutes (a
    --window of 150 s: 120 s); RolloutSettingsError naming --window when the window is under a
    minute."""
    if window_s < CLOUDWATCH_PERIOD_S:
        raise RolloutSettingsError(
            sentence(
                "--window",
                f"{window_s:g}s",
                f"at least {CLOUDWATCH_PERIOD_S}s with figures from {service} (the metrics come "
                "in 1-minute periods), such as 60s or 2m; or --prometheus URL",
            )
        )
    return int(window_s // CLOUDWATCH_PERIOD_S) * CLOUDWATCH_PERIOD_S


def cloudwatch_client(region: str) -> Any:
    """boto3's CloudWatch client of the stack's region, with timeouts (no call hangs a window)."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=15, retries={"max_attempts": 3})
    return boto3.client("cloudwatch", region_name=region, config=config)


class TrackMetricsSource:
    """A group stack's per-track figures from its cloud's 1-minute metrics: a window reads one
    period of its whole minutes ending `delay_s` before `end` (the cloud publishes a minute
    late), each track's figures going to the version it serves (`versions()`, read at `begin`:
    the engine never switches a track inside a window). `dimensions()` is the stack output
    ROLLOUT_METRICS_OUTPUT, read once it names the candidate (the rollout's first `up` made
    it). Subclasses read (requests, 5xx, p99) per track: `_read(tracks, start, end)`."""

    service = ""
    tracks_key = ""  # the output's key whose mapping names each track's resource
    track_kind = ""  # what that resource is

    def __init__(
        self,
        dimensions: Callable[[], Mapping[str, Any]],
        versions: Callable[[], dict[str, str]],
        window_s: float,
        region: str,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        delay_s: float = CLOUDWATCH_DELAY_S,
    ) -> None:
        self.period_s = cloudwatch_period(window_s, self.service)
        self.region, self.delay_s = region, delay_s
        self._dimensions, self._versions_of, self._clock = dimensions, versions, clock
        self._client = client
        self._dims: Mapping[str, Any] | None = None
        self._versions: dict[str, str] = {}

    def describe(self) -> str:
        """Where the figures come from, in words (the command's line before the first step)."""
        raise NotImplementedError

    def dims(self) -> Mapping[str, Any]:
        if self._dims is None:
            dims = self._dimensions()
            if not (dims.get(self.tracks_key) or {}).get("candidate"):
                raise SignalError(
                    f"the stack output {ROLLOUT_METRICS_OUTPUT} names no candidate "
                    f"{self.track_kind} ({dict(dims)}): `torchfleet up` with the stack's "
                    "`rollout` block exports it"
                )
            self._dims = dims
        return self._dims

    def span(self, now: float) -> tuple[datetime, datetime]:
        """The period a window ending `now` reads: whole minutes, `delay_s` behind."""
        end = math.floor((now - self.delay_s) / CLOUDWATCH_PERIOD_S) * CLOUDWATCH_PERIOD_S
        return (
            datetime.fromtimestamp(end - self.period_s, UTC),
            datetime.fromtimestamp(end, UTC),
        )

    def begin(self) -> None:
        self._versions = self._versions_of()

    def recent(self, window_s: float) -> dict[str, Figures]:
        """The last published period (the one a window ending now reads): no waiting."""
        self.begin()
        return self.end()

    def latency_bounds(self) -> Sequence[float] | None:
        """The bounds the track's p99 is read from (None: a percentile statistic, exact)."""
        raise NotImplementedError

    def _read(
        self, tracks: Mapping[str, Any], start: datetime, end: datetime
    ) -> dict[str, Figures]:
        raise NotImplementedError  # each cloud's subclass reads its own service

    def end(self) -> dict[str, Figures]:
        start, end = self.span(self._clock())
        tracks = self.dims()[self.tracks_key]  # the stack's dimensions first: no call without
        read = self._read(tracks, start, end)
        by_version: dict[str, list[Figures]] = defaultdict(list)
        for track, f in sorted(read.items()):
            version = self._versions.get(track)
            if version is not None:
                by_version[version].append(Figures(version, f.requests, f.errors, f.p99_s))
        return {v: _together(v, figs) for v, figs in by_version.items()}


class CloudWatchSource(TrackMetricsSource):
    """An AWS group stack without a Prometheus: its ALB's per-target-group metrics (see the
    module doc), one GetMetricData call per window."""

    service = "CloudWatch"
    tracks_key = "target_groups"
    track_kind = "target group"

    def latency_bounds(self) -> None:
        return None  # TargetResponseTime's p99 is CloudWatch's percentile of the raw times

    def describe(self) -> str:
        return (
            f"CloudWatch (AWS/ApplicationELB per target group, {self.region}): each window "
            f"reads a {self.period_s} s metric period of whole minutes, ending "
            f"{self.delay_s:g} s before the window does"
        )

    def queries(self) -> list[dict[str, Any]]:
        dims = self.dims()
        out = []
        for track, target_group in sorted(dims["target_groups"].items()):
            for key, (metric, stat) in ALB_METRICS.items():
                out.append(
                    {
                        "Id": f"{track}_{key}",
                        "MetricStat": {
                            "Metric": {
                                "Namespace": dims.get("namespace", ALB_NAMESPACE),
                                "MetricName": metric,
                                "Dimensions": [
                                    {"Name": "LoadBalancer", "Value": dims["load_balancer"]},
                                    {"Name": "TargetGroup", "Value": target_group},
                                ],
                            },
                            "Period": self.period_s,
                            "Stat": stat,
                        },
                        "ReturnData": True,
                    }
                )
        return out

    def _read(
        self, tracks: Mapping[str, Any], start: datetime, end: datetime
    ) -> dict[str, Figures]:
        from botocore.exceptions import BotoCoreError, ClientError

        queries = self.queries()
        if self._client is None:
            self._client = cloudwatch_client(self.region)
        try:
            doc = self._client.get_metric_data(
                MetricDataQueries=queries, StartTime=start, EndTime=end
            )
        except (BotoCoreError, ClientError) as err:
            raise SignalError(f"CloudWatch GetMetricData ({self.region}): {err}") from err
        got: dict[str, list[float]] = {}
        for result in doc.get("MetricDataResults", []):
            if result.get("StatusCode", "Complete") != "Complete":
                raise SignalError(
                    f"CloudWatch GetMetricData ({self.region}): {result['Id']} is "
                    f"{result['StatusCode']} {result.get('Messages', [])}"
                )
            got[result["Id"]] = [float(v) for v in result.get("Values", [])]
        out = {}
        for track in tracks:
            requests = sum(got.get(f"{track}_requests", []))
            p99 = got.get(f"{track}_p99", [])
            out[track] = Figures(
                track,
                requests,
                sum(got.get(f"{track}_errors", [])),
                max(p99) if p99 and requests else None,
            )
        return out


# --- CloudMonitor (an Alibaba group stack's nodes' own metrics) --------------------------------

# The CLB's own layer-7 figures of the whole instance (both tracks), per second, 1-minute
# periods: what CloudMonitorSource holds the nodes' totals against.
CLB_NAMESPACE = "acs_slb_dashboard"
CLB_METRICS = ("InstanceQps", "InstanceUpstreamCode5xx")
CROSS_CHECK_SLACK = 0.2  # of the load balancer's figure
MIN_REQUEST_SLACK = 20.0
MIN_ERROR_SLACK = 5.0

# metric -> the statistic read over each minute; the node agent publishes them every 15 s
# (torchfleet_agent/metrics.py: what each node answered since its last sample)
NODE_METRICS = {
    "requests": (REQUEST_COUNT_METRIC, "Sum"),
    "errors": (ERROR_COUNT_METRIC, "Sum"),
    "p99": (LATENCY_P99_METRIC, "Maximum"),
}


def cms_client(region: str) -> Any:
    """A CloudMonitor client with the operator's Alibaba keys (ALICLOUD_CMS_ENDPOINT overrides)."""
    from alibabacloud_cms20190101.client import Client

    from infra.credentials import CredentialsError, operator_config

    try:
        return Client(operator_config(region, "CloudMonitor", "ALICLOUD_CMS_ENDPOINT"))
    except CredentialsError as err:
        raise SignalError(f"{err.message}: {err.fix}") from None


class CloudMonitorSource(TrackMetricsSource):
    """An Alibaba group stack without a Prometheus: the CLB's own CloudMonitor figures are per
    listener (both tracks sit in one VServer group), so the figures are the nodes': the agent
    publishes, per node every 15 s, the requests it answered, their 5xx and their p99 to the
    stack's application group, keyed by the node's scaling group (one per track). A window reads
    each track's minutes with DescribeMetricList (namespace acs_customMetric_<account>, the
    dimension {groupId, "scaling_group=<id>"}): requests and 5xx summed, the p99 the highest a
    node reported in a 15 s interval (the combined p99 is never above it: a guard errs towards
    the rollback)."""

    service = "CloudMonitor"
    tracks_key = "scaling_groups"
    track_kind = "scaling group"

    def latency_bounds(self) -> tuple[float, ...]:
        """The runtime's latency buckets, which the node agent reads LatencyP99 from."""
        return LATENCY_BOUNDS

    def describe(self) -> str:
        return (
            f"CloudMonitor (the nodes' RequestCount, ErrorCount, LatencyP99 per scaling group, "
            f"{self.region}): each window reads a {self.period_s} s period of whole minutes, "
            f"ending {self.delay_s:g} s before the window does"
        )

    def _points(self, metric: str, group: str, start: datetime, end: datetime) -> list[dict]:
        dims = self.dims()
        return self._describe(
            dims["namespace"],
            metric,
            [{"groupId": str(dims["metric_group"]), "dimension": f"scaling_group={group}"}],
            start,
            end,
        )

    def _describe(
        self,
        namespace: str,
        metric: str,
        dimensions: list[dict[str, str]],
        start: datetime,
        end: datetime,
    ) -> list[dict]:
        from alibabacloud_cms20190101 import models

        request = models.DescribeMetricListRequest(
            namespace=namespace,
            metric_name=metric,
            period=str(self.period_s),
            start_time=str(int(start.timestamp() * 1000)),
            end_time=str(int(end.timestamp() * 1000)),
            dimensions=json.dumps(dimensions),
        )
        if self._client is None:
            self._client = cms_client(self.region)
        points: list[dict] = []
        while True:
            try:
                body = self._client.describe_metric_list(request).body
            except Exception as err:  # the SDK's errors and the network's
                raise SignalError(f"CloudMonitor DescribeMetricList {metric}: {err}") from err
            if body.success is False or str(body.code or "200") != "200":
                raise SignalError(
                    f"CloudMonitor DescribeMetricList {metric}: {body.code} {body.message}"
                )
            points += json.loads(body.datapoints or "[]")
            if not body.next_token:
                return points
            request.next_token = body.next_token

    def _balancer(self, start: datetime, end: datetime) -> tuple[float, float]:
        """The CLB's own requests and backend 5xx over the period (acs_slb_dashboard, its
        per-second averages times the period's seconds): figures no node can write."""
        lb = self.dims().get("load_balancer")
        if not lb:
            raise SignalError(
                f"the stack output {ROLLOUT_METRICS_OUTPUT} names no load_balancer: "
                "`torchfleet up` exports it"
            )
        out = []
        for metric in CLB_METRICS:
            points = self._describe(CLB_NAMESPACE, metric, [{"instanceId": lb}], start, end)
            out.append(sum(float(p.get("Average", 0.0)) for p in points) * self.period_s)
        return out[0], out[1]

    def _read(
        self, tracks: Mapping[str, Any], start: datetime, end: datetime
    ) -> dict[str, Figures]:
        out = {}
        for track, group in sorted(tracks.items()):
            got: dict[str, list[float]] = {}
            for key, (metric, stat) in NODE_METRICS.items():
                points = self._points(metric, str(group), start, end)
                missing = [p for p in points if stat not in p]
                if missing:
                    raise SignalError(
                        f"CloudMonitor {metric} data points have no {stat} "
                        f"(fields {sorted(missing[0])})"
                    )
                got[key] = [float(p[stat]) for p in points]
            requests = sum(got["requests"])
            out[track] = Figures(
                track,
                requests,
                sum(got["errors"]),
                max(got["p99"]) if got["p99"] and requests else None,
            )
        cross_check(
            sum(f.requests for f in out.values()),
            sum(f.errors for f in out.values()),
            *self._balancer(start, end),
        )
        return out


def cross_check(
    node_requests: float, node_errors: float, lb_requests: float, lb_errors: float
) -> None:
    """SignalMismatch unless the nodes' own totals agree with the load balancer's: no more
    requests than it forwarded, and as many 5xx as its backends answered, each within
    CROSS_CHECK_SLACK (minute edges, the agent's 15 s publishing). What it cannot see: a node
    moving figures between the tracks while the totals still agree (docs/security.md)."""

    def near(mine: float, theirs: float, floor: float) -> bool:
        return abs(mine - theirs) <= max(floor, CROSS_CHECK_SLACK * theirs)

    if node_requests > lb_requests + max(MIN_REQUEST_SLACK, CROSS_CHECK_SLACK * lb_requests):
        raise SignalMismatch(
            f"the nodes report {node_requests:.0f} requests, the load balancer forwarded "
            f"{lb_requests:.0f}"
        )
    if not near(node_errors, lb_errors, MIN_ERROR_SLACK):
        raise SignalMismatch(
            f"the nodes report {node_errors:.0f} 5xx, the load balancer saw {lb_errors:.0f} from "
            "its backends"
        )


def _together(version: str, figures: list[Figures]) -> Figures:
    """Two tracks on one version (no split, or the promotion): counts add up; a p99 cannot be
    combined from two, so the higher one (a guard errs towards the rollback)."""
    p99s = [f.p99_s for f in figures if f.p99_s is not None]
    return Figures(
        version,
        sum(f.requests for f in figures),
        sum(f.errors for f in figures),
        max(p99s) if p99s else None,
    )
