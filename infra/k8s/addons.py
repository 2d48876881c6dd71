"""The Helm releases around the runtime, as (chart, namespace, values) specs.

Which add-on and why (the choices of this mode):
- HPA on queue depth and GPU utilisation through the Prometheus adapter, not KEDA: the scaling
  object is then a plain autoscaling/v2 HorizontalPodAutoscaler (validated with the rest against
  the cluster's OpenAPI schema, no CRD, no operator with cluster-wide webhooks). KEDA's advantage, scaling
  to zero, is not needed: dev clusters reach zero through the node-pool schedule.
- A small Prometheus (server only, no alertmanager/exporters, 2 h in an emptyDir) scraping the
  pods that carry prometheus.io/* annotations: the adapter's source, not the monitoring system.
- EKS: NVIDIA's device plugin (the AL2023 NVIDIA AMI has the driver and container toolkit, not
  the plugin; the GPU Operator would install a second driver), the cluster autoscaler (works
  with the managed node groups, their schedules and the on-demand fallback; Karpenter would
  replace the node groups), and the AWS Node Termination Handler in IMDS mode on GPU nodes.
  ACK needs none of the three: see infra/alicloud/cluster.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.config import StackConfig
from infra.k8s.settings import Chart
from infra.k8s.workload import GPU_METRIC, QUEUE_METRIC, gpu_node_labels

ADDON_NAMESPACE = "torchfleet-system"
PROMETHEUS = "torchfleet-prometheus"
SYSTEM_LABELS = {"torchfleet-role": "system"}  # the system node pool's label
SCRAPE_INTERVAL = "15s"
# The autoscaler's image must match the cluster's minor version (its compatibility rule);
# latest patch per minor, from kubernetes/autoscaler's release tags (2026-08).
CLUSTER_AUTOSCALER_IMAGE = {"1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2"}


@dataclass(frozen=True)
class Release:
    key: str  # kubernetes.charts.<key>
    chart: Chart
    namespace: str
    values: dict[str, Any]


def _system_pod() -> dict[str, Any]:
    return {"nodeSelector": dict(SYSTEM_LABELS)}


def prometheus(cfg: StackConfig) -> Release:
    assert cfg.kubernetes
    off = {"enabled": False}
    return Release(
        "prometheus",
        cfg.kubernetes.charts["prometheus"],
        ADDON_NAMESPACE,
        {
            "alertmanager": off,
            "kube-state-metrics": off,
            "prometheus-node-exporter": off,
            "prometheus-pushgateway": off,
            "server": {
                "fullnameOverride": PROMETHEUS,
                "retention": "2h",
                "persistentVolume": {"enabled": False},
                "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "30s"},
                "resources": {
                    "requests": {"cpu": "100m", "memory": "512Mi"},
                    "limits": {"memory": "1Gi"},
                },
                **_system_pod(),
            },
        },
    )


def _pod_rule(metric: str, query: str) -> dict[str, Any]:
    """One adapter rule: `metric` per pod on custom.metrics.k8s.io, computed by `query`."""
    return {
        "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
        "resources": {
            "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        },
        "name": {"matches": f"^{metric}$", "as": metric},
        "metricsQuery": f"{query} by (<<.GroupBy>>)",
    }


def prometheus_adapter(cfg: StackConfig) -> Release:
    """Serves torchfleet_queue_depth and torchfleet_gpu_utilization_ratio per pod on
    custom.metrics.k8s.io for the HPA."""
    assert cfg.kubernetes
    return Release(
        "prometheus_adapter",
        cfg.kubernetes.charts["prometheus_adapter"],
        ADDON_NAMESPACE,
        {
            "prometheus": {"url": f"http://{PROMETHEUS}.{ADDON_NAMESPACE}.svc", "port": 80},
            "rules": {
                "default": False,
                "custom": [
                    # The peak over the last minute: a queue that fills between scrapes still counts.
                    _pod_rule(
                        QUEUE_METRIC, "max(max_over_time(<<.Series>>{<<.LabelMatchers>>}[1m]))"
                    ),
                    # The minute's mean: utilisation is already an average over NVML's sample period.
                    _pod_rule(
                        GPU_METRIC, "max(avg_over_time(<<.Series>>{<<.LabelMatchers>>}[1m]))"
                    ),
                ],
            },
            "resources": {
                "requests": {"cpu": "50m", "memory": "128Mi"},
                "limits": {"memory": "256Mi"},
            },
            **_system_pod(),
        },
    )


def device_plugin(cfg: StackConfig) -> Release:
    """The chart's own affinity selects nodes labelled nvidia.com/gpu.present=true (the GPU
    node groups set it) and tolerates the nvidia.com/gpu taint."""
    assert cfg.kubernetes
    return Release(
        "device_plugin",
        cfg.kubernetes.charts["device_plugin"],
        "kube-system",
        {
            "failOnInitError": True,  # a GPU node whose driver is broken must not look healthy
            "resources": {
                "requests": {"cpu": "50m", "memory": "64Mi"},
                "limits": {"memory": "128Mi"},
            },
        },
    )


def cluster_autoscaler(
    cfg: StackConfig, cluster_name: Any, role_arn: Any, spot_group_pattern: str
) -> Release:
    """Scales the GPU node groups between their min and max for pending GPU pods: spot first
    (priority expander), the on-demand group when spot does not come within 10 minutes."""
    assert cfg.kubernetes
    return Release(
        "cluster_autoscaler",
        cfg.kubernetes.charts["cluster_autoscaler"],
        "kube-system",
        {
            "cloudProvider": "aws",
            "awsRegion": cfg.region,
            "autoDiscovery": {"clusterName": cluster_name},
            "image": {"tag": CLUSTER_AUTOSCALER_IMAGE[cfg.kubernetes.version]},
            "rbac": {
                "serviceAccount": {
                    "name": "cluster-autoscaler",
                    "annotations": {"eks.amazonaws.com/role-arn": role_arn},
                }
            },
            "extraArgs": {
                "expander": "priority,least-waste",
                "balance-similar-node-groups": True,
                # The runtime's scratch emptyDirs hold nothing worth keeping a node for.
                "skip-nodes-with-local-storage": False,
                "max-node-provision-time": "10m0s",
                "scale-down-unneeded-time": "10m0s",
                "scale-down-delay-after-add": "10m0s",
                # The on-demand group may grow as spot's fallback; the total stays within nodes.max.
                "max-nodes-total": cfg.nodes.max + cfg.kubernetes.system.count,
            },
            "expanderPriorities": {"50": [spot_group_pattern], "10": [".*"]},
            "resources": {
                "requests": {"cpu": "100m", "memory": "300Mi"},
                "limits": {"memory": "600Mi"},
            },
            **_system_pod(),
        },
    )


def node_termination_handler(cfg: StackConfig) -> Release:
    """IMDS mode on every GPU node: cordon and drain on the 2-minute spot notice and before a
    scheduled EC2 event. Rebalance handling stays with EKS (managed node groups launch a
    replacement first, then drain); queue mode would add an SQS queue, EventBridge rules and
    lifecycle hooks on ASGs that EKS owns, for events EKS already handles."""
    assert cfg.kubernetes
    return Release(
        "node_termination_handler",
        cfg.kubernetes.charts["node_termination_handler"],
        "kube-system",
        {
            "enableSqsTerminationDraining": False,
            "enableSpotInterruptionDraining": True,
            "enableScheduledEventDraining": True,
            "enableASGLifecycleDraining": True,
            "enableRebalanceMonitoring": False,
            "enableRebalanceDraining": False,
            "podTerminationGracePeriod": -1,  # each pod's own grace (the runtime's drain)
            "daemonsetNodeSelector": gpu_node_labels(),
            "resources": {
                "requests": {"cpu": "50m", "memory": "64Mi"},
                "limits": {"memory": "128Mi"},
            },
        },
    )
