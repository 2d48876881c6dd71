"""The `torchfleet:kubernetes` block of a `mode: kubernetes` stack, typed and validated.

`parse(reader, ...)` is called by infra/config/'s `load()` with its problem-collecting reader
(torchfleet_compat's Problems, with the stack's key namespace and number parsing), so a bad value
here is reported in the same single pass and the same sentence as every other key (key, value,
what is allowed) and fails before any resource is registered. This module imports nothing from
infra.config (infra/config/kubernetes.py imports it): the reader is duck-typed (`Reader` in
infra/config/reader.py).

Rules that exist elsewhere are not repeated: spot caps come from `StackConfig.spot_cap`, node
counts from `nodes`, GPUs per node from the catalog through the instance types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from infra.constants import PROJECT
from infra.lifecycle import GPU_TARGET_DEFAULT, GPU_TARGET_RANGE

# Kubernetes minor versions a stack may ask for: the ones EKS and ACK both offered in standard
# support when this was written (2026-12) AND that kubernetes-validate 1.37.0 carries schemas
# for, so the manifests are checked against the version the cluster runs (tests/infra).
KUBERNETES_VERSIONS = ("1.33", "1.34", "1.35")
DEFAULT_VERSION = "1.35"
DEFAULT_NAMESPACE = PROJECT
DEFAULT_QUEUE_TARGET = 16  # per-pod average of torchfleet_queue_depth the HPA holds
SUBKEYS = (
    "version",
    "image",
    "namespace",
    "replicas",
    "queue_target",
    "gpu_utilization_target",
    "model_prefix",
    "system",
    "charts",
)
SYSTEM_SUBKEYS = ("instance_type", "count", "usd_per_hour")


@dataclass(frozen=True)
class Chart:
    """A pinned Helm chart. `repo` is an HTTP(S) chart repository or an oci:// registry path;
    both are one config value away (China regions cannot reach the public ones: point them at
    a mirror with `kubernetes.charts.<name>.repo`)."""

    name: str
    repo: str
    version: str

    @property
    def oci(self) -> bool:
        return self.repo.startswith("oci://")


# Chart versions pinned here, checked against each project's own repository (2026-08):
# NVIDIA/k8s-device-plugin deployments/helm (0.20.0), prometheus-community/helm-charts
# (prometheus-29.27.0, prometheus-adapter-5.3.0), kubernetes/autoscaler
# (cluster-autoscaler-chart-9.59.0, app 1.35), aws/aws-node-termination-handler
# config/helm (0.27.6, app 1.25.6; published as an OCI chart on public ECR).
DEFAULT_CHARTS: dict[str, Chart] = {
    "device_plugin": Chart(
        "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.0"
    ),
    "prometheus": Chart(
        "prometheus", "https://prometheus-community.github.io/helm-charts", "29.27.0"
    ),
    "prometheus_adapter": Chart(
        "prometheus-adapter", "https://prometheus-community.github.io/helm-charts", "5.3.0"
    ),
    "cluster_autoscaler": Chart(
        "cluster-autoscaler", "https://kubernetes.github.io/autoscaler", "9.59.0"
    ),
    "node_termination_handler": Chart(
        "aws-node-termination-handler", "oci://public.ecr.aws/aws-ec2/helm", "0.27.6"
    ),
}
# Which charts a cloud installs: ACK ships its own GPU device plugin on GPU node pools and runs
# its cluster autoscaler and spot handling as managed components (see infra/alicloud/cluster.py).
CHARTS_BY_CLOUD = {
    "aws": (
        "device_plugin",
        "prometheus",
        "prometheus_adapter",
        "cluster_autoscaler",
        "node_termination_handler",
    ),
    "alicloud": ("prometheus", "prometheus_adapter"),
}
# The cluster's system nodes (CoreDNS, Prometheus, the adapter, the autoscaler): small,
# on-demand, untainted, so cluster services never sit on (or wait for) a GPU node.
# Reference on-demand prices: AWS m6i.large, us-east-1 Linux price list (2024-06, the same list
# as compat/catalog.yml). Alibaba ecs.g7.large: an APPROXIMATE figure (no price list was at hand;
# same +/-20% caveat as the catalog's Alibaba prices): set `kubernetes.system.usd_per_hour`.
SYSTEM_DEFAULTS = {"aws": ("m6i.large", 0.096), "alicloud": ("ecs.g7.large", 0.10)}

_IMAGE_RE = re.compile(
    r"^(?P<repo>(?:[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::\d{1,5})?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}/$")
_CHART_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$")


@dataclass(frozen=True)
class Replicas:
    min: int
    max: int


@dataclass(frozen=True)
class SystemPool:
    instance_type: str
    count: int
    usd_per_hour: float


@dataclass(frozen=True)
class KubernetesSettings:
    version: str  # "1.35": the cluster's Kubernetes minor version
    image: str  # the runtime image (runtime/Containerfile), with a tag or a digest
    namespace: str
    replicas: Replicas  # pods, one GPU each; the HPA moves between them
    queue_target: int
    gpu_utilization_target: float  # percent
    model_prefix: str | None  # objects under model_bucket mounted at /models; None: baked
    system: SystemPool
    charts: dict[str, Chart] = field(default_factory=dict)


class Reader(Protocol):
    problems: list[str]

    def fail(self, key: str, value: Any, allowed: str) -> None: ...

    def number(
        self, key: str, value: Any, kind: Any, lo: float | None, hi: float | None, what: str
    ) -> Any: ...


def parse(
    r: Reader,
    raw: dict[str, Any] | None,
    *,
    cloud: str,
    zones: tuple[str, ...],
    gpus_per_node: int | None,
    nodes_max: int | None,
    node_image: str,
    spot_enabled: bool,
    spot_ratio: float | None,
    spot_percentage: int | None,
    model_bucket: str | None,
) -> KubernetesSettings | None:
    """The `kubernetes` block; every problem goes to `r`. None when anything is wrong."""
    key = "kubernetes"
    if raw is None:
        r.fail(
            key,
            None,
            "a block {image, version, replicas, ...} in mode: kubernetes (at "
            "least `image`: the runtime image built by `make image`, pushed where the "
            "cluster pulls from)",
        )
        return None
    before = len(r.problems)
    version = str(raw.get("version", DEFAULT_VERSION))
    if version not in KUBERNETES_VERSIONS:
        r.fail(f"{key}.version", raw.get("version"), " | ".join(KUBERNETES_VERSIONS))
    image = _image(r, raw.get("image"))
    namespace = raw.get("namespace", DEFAULT_NAMESPACE)
    if (
        not isinstance(namespace, str)
        or not _DNS_LABEL_RE.match(namespace)
        or namespace.startswith("kube-")
    ):
        r.fail(
            f"{key}.namespace",
            namespace,
            "a DNS label (lowercase letters, digits, -) not starting with kube-",
        )
    replicas = _replicas(r, raw.get("replicas"), gpus_per_node, nodes_max)
    target = r.number(
        f"{key}.queue_target",
        raw.get("queue_target", DEFAULT_QUEUE_TARGET),
        int,
        1,
        100000,
        "an integer >= 1 (instances waiting per pod)",
    )
    lo, hi = GPU_TARGET_RANGE
    gpu = r.number(
        f"{key}.gpu_utilization_target",
        raw.get("gpu_utilization_target", GPU_TARGET_DEFAULT),
        float,
        lo,
        hi,
        f"a number in {lo}..{hi} (the mean GPU utilisation per pod, percent)",
    )
    prefix = raw.get("model_prefix")
    if prefix is not None:
        if not model_bucket:
            r.fail(
                f"{key}.model_prefix",
                prefix,
                "unset without model_bucket (the prefix names "
                "objects in that bucket; without it the model is baked into the image)",
            )
        elif not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or prefix.startswith("/"):
            r.fail(
                f"{key}.model_prefix",
                prefix,
                "an object key prefix ending in / such as "
                "resnet50/v3/ (holding model.pt and its model.json)",
            )
    system = _system(r, raw.get("system"), cloud)
    charts = _charts(r, raw.get("charts"), cloud)

    # Cluster-wide rules of this mode, next to the block they belong to.
    if len(zones) < 2:
        r.fail(
            "zones",
            list(zones),
            "at least 2 zones in mode: kubernetes (EKS needs subnets in "
            "two zones; pods spread across zones)",
        )
    if node_image != "auto":
        r.fail(
            "image",
            node_image,
            "auto in mode: kubernetes (nodes run the managed GPU image: "
            "EKS AL2023 NVIDIA / ACK's GPU image, with the driver the container needs)",
        )
    if spot_enabled and spot_percentage:
        r.fail(
            "spot.on_demand_percentage",
            spot_percentage,
            "0 in mode: kubernetes (the GPU "
            "pool keeps spot.on_demand_base on-demand nodes and adds spot above them)",
        )
    if cloud == "aws" and spot_enabled and spot_ratio is not None and spot_ratio != 1.0:
        r.fail(
            "spot.max_price_ratio",
            spot_ratio,
            "1.0 in mode: kubernetes on aws. EKS managed "
            "node groups take no spot max price (EKS refuses launch templates with instance "
            "market options); EC2 caps every spot instance at its on-demand price, which is "
            "ratio 1.0. For a lower cap use mode: group",
        )
    if (
        len(r.problems) > before
        or image is None
        or replicas is None
        or target is None
        or gpu is None
        or system is None
    ):
        return None
    return KubernetesSettings(
        version=version,
        image=image,
        namespace=namespace,
        replicas=replicas,
        queue_target=target,
        gpu_utilization_target=gpu,
        model_prefix=prefix,
        system=system,
        charts=charts,
    )


def _image(r: Reader, image: Any) -> str | None:
    what = (
        "an image reference with a tag or digest, e.g. "
        "registry.example.com/ml/torchfleet-runtime:0.1.0-cu116 (the image `make image` "
        "builds from runtime/Containerfile; not :latest, a deploy must say what it runs)"
    )
    if image is None:
        r.fail("kubernetes.image", None, what)
        return None
    m = _IMAGE_RE.match(image) if isinstance(image, str) else None
    if not m or not (m.group("tag") or m.group("digest")) or m.group("tag") == "latest":
        r.fail("kubernetes.image", image, what)
        return None
    return image


def _replicas(
    r: Reader, raw: Any, gpus_per_node: int | None, nodes_max: int | None
) -> Replicas | None:
    if raw is not None and not isinstance(raw, dict):
        r.fail("kubernetes.replicas", raw, "a map {min, max}")
        return None
    raw = raw or {}
    for sub in raw:
        if sub not in ("min", "max"):
            r.fail(f"kubernetes.replicas.{sub}", raw[sub], "the keys min, max")
    if gpus_per_node is None or nodes_max is None:
        return None
    capacity = gpus_per_node * nodes_max  # one GPU per pod
    lo = r.number("kubernetes.replicas.min", raw.get("min", 1), int, 1, None, "an integer >= 1")
    hi = r.number(
        "kubernetes.replicas.max", raw.get("max", capacity), int, 1, None, "an integer >= 1"
    )
    if lo is None or hi is None:
        return None
    if not lo <= hi <= capacity:
        r.fail(
            "kubernetes.replicas",
            raw,
            f"min <= max <= {capacity} (nodes.max {nodes_max} x "
            f"{gpus_per_node} GPU(s) per node; each pod takes one GPU)",
        )
        return None
    return Replicas(min=lo, max=hi)


def _system(r: Reader, raw: Any, cloud: str) -> SystemPool | None:
    if raw is not None and not isinstance(raw, dict):
        r.fail("kubernetes.system", raw, "a map {instance_type, count, usd_per_hour}")
        return None
    raw = raw or {}
    for sub in raw:
        if sub not in SYSTEM_SUBKEYS:
            r.fail(f"kubernetes.system.{sub}", raw[sub], "the keys " + ", ".join(SYSTEM_SUBKEYS))
    default_type, default_price = SYSTEM_DEFAULTS[cloud]
    itype = raw.get("instance_type", default_type)
    if not isinstance(itype, str) or not re.match(r"^[a-z0-9][a-z0-9.-]{2,40}$", itype):
        r.fail("kubernetes.system.instance_type", itype, f"an instance type such as {default_type}")
        return None
    if "instance_type" in raw and "usd_per_hour" not in raw and itype != default_type:
        r.fail(
            "kubernetes.system.usd_per_hour",
            None,
            f"its on-demand USD/hour when "
            f"instance_type is not {default_type} (the plan prices the system nodes)",
        )
    count = r.number(
        "kubernetes.system.count",
        raw.get("count", 1),
        int,
        1,
        10,
        "an integer 1..10 (system nodes; 2 for a highly available prod cluster)",
    )
    price = r.number(
        "kubernetes.system.usd_per_hour",
        raw.get("usd_per_hour", default_price),
        float,
        0.0001,
        None,
        "a price > 0 (USD/hour)",
    )
    if count is None or price is None:
        return None
    return SystemPool(instance_type=itype, count=count, usd_per_hour=price)


def _charts(r: Reader, raw: Any, cloud: str) -> dict[str, Chart]:
    names = CHARTS_BY_CLOUD[cloud]
    out = {name: DEFAULT_CHARTS[name] for name in names}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        r.fail("kubernetes.charts", raw, "a map of chart -> {repo, version}")
        return out
    for name, spec in raw.items():
        if name not in names:
            r.fail(
                f"kubernetes.charts.{name}", spec, f"charts {cloud} installs: {', '.join(names)}"
            )
            continue
        if not isinstance(spec, dict) or set(spec) - {"repo", "version"}:
            r.fail(f"kubernetes.charts.{name}", spec, "a map {repo, version}")
            continue
        repo = spec.get("repo", out[name].repo)
        version = str(spec.get("version", out[name].version))
        if not isinstance(repo, str) or not re.match(r"^(https://|oci://)[^\s]+[^/\s]$", repo):
            r.fail(
                f"kubernetes.charts.{name}.repo",
                repo,
                "an https:// chart repository or an oci:// registry path (no trailing /)",
            )
            continue
        if not _CHART_VERSION_RE.match(version):
            r.fail(
                f"kubernetes.charts.{name}.version",
                version,
                "an exact chart version x.y.z (pinned: a deploy must not float to a new chart)",
            )
            continue
        out[name] = Chart(out[name].name, repo, version)
    return out
