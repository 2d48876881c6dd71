"""The runtime's Kubernetes objects as plain manifests (dicts in the API's own camelCase).

Pure functions of the stack config and a `Placement` (the few cloud-specific facts: node
labels, the GPU taint, load-balancer annotations, the model volume). component.py registers
these manifests unchanged through pulumi_kubernetes, and tests/infra validates the same dicts
against the Kubernetes OpenAPI schema of the cluster's version.

Contract with the runtime (runtime/src/torchfleet_runtime): HTTP on `service_port` with
GET /readyz (200 only when warmed and not draining), GET /livez, GET /metrics
(`torchfleet_queue_depth`); SIGTERM drains within `drain_timeout_s`, whose default is read
from the runtime's settings contract (torchfleet_compat.runtime_settings, one source).
Contract with the image (runtime/Containerfile): uid/gid 10001, the model at /models/model.pt
(mounted here, or baked in; with a `rollout` block, its stable_model), a writable HOME only
where this module mounts one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torchfleet_compat import runtime_settings
from torchfleet_compat.runtime_settings import ENV_PREFIX, FIELDS

from infra import edge
from infra.config import RolloutSplit, StackConfig
from infra.constants import HEALTH_PATH, PROJECT
from infra.interface import NODE_ROLE_TAG

APP = "torchfleet-runtime"
CANDIDATE = f"{APP}-candidate"  # the rollout's candidate Deployment beside the stable one
TRACK_LABEL = "track"  # the candidate's pods carry track: candidate
LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": PROJECT}
SELECTOR = {"app.kubernetes.io/name": APP}
IMAGE_UID = 10001  # runtime/Containerfile ARG UID/GID
MODEL_DIR = "/models"  # the image's runtime.yml reads /models/model.pt
HOME = "/home/torchfleet"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = (GPU_RESOURCE, "true", "NoSchedule")  # GPU nodes take only pods that ask for GPUs
ZONE_KEY = "topology.kubernetes.io/zone"
HOST_KEY = "kubernetes.io/hostname"
MODEL_CLAIM = "torchfleet-model"
# The API tokens (infra.edge.accepted) as a Secret mounted read-only: kubelet swaps the file when
# the Secret changes and the runtime re-reads it, so a rotation restarts no pod.
TOKEN_SECRET = "torchfleet-api-token"
TOKEN_KEY = "api-tokens"
TOKEN_DIR = "/etc/torchfleet/secrets"
# Time for the load balancer and kube-proxy to stop sending before SIGTERM: endpoints leave the
# Service when the pod starts terminating, the cloud LB follows within a few seconds.
PRESTOP_SLEEP_S = 10
DRAIN_MARGIN_S = 15  # interpreter exit, CUDA teardown, log flush after the drain
# Image pull is not counted; model load, CUDA init and warming every batch size are.
STARTUP_BUDGET_S = 900
STARTUP_PERIOD_S = 10
# Node headroom left to the kubelet, the CNI, kube-proxy, the device plugin and the log agent.
RESERVED_CPU = 1
POD_MEMORY_SHARE = 0.7


def runtime_default(key: str) -> Any:
    """A runtime config default, from the runtime's settings contract."""
    return runtime_settings.defaults()[key]


def termination_grace_s() -> int:
    """preStop + the runtime's drain_timeout_s + margin: SIGKILL never cuts a drain short."""
    return PRESTOP_SLEEP_S + math.ceil(float(runtime_default("drain_timeout_s"))) + DRAIN_MARGIN_S


def runtime_env(**values: Any) -> list[dict[str, str]]:
    """TORCHFLEET_<KEY> variables, refusing keys the runtime does not have."""
    unknown = [k for k in values if k not in FIELDS]
    assert not unknown, f"not runtime config keys: {unknown}"
    return [{"name": ENV_PREFIX + k.upper(), "value": str(v)} for k, v in values.items()]


@dataclass(frozen=True)
class Placement:
    """What the cloud decides for the workload."""

    gpu_node_labels: dict[str, str]  # labels every GPU node carries (the node pool sets them)
    service_annotations: dict[str, str]  # the cloud controller's load-balancer settings
    service_account_annotations: dict[str, str] = field(default_factory=dict)
    model_claim: str | None = None  # a PersistentVolumeClaim holding the model, read-only


def names(cfg: StackConfig) -> dict[str, str]:
    """Where the runtime's objects are, as the stack exports them (output `workload`): what
    `torchfleet up|status|rollout` read on the cluster (infra/deploy/kubernetes.py)."""
    assert cfg.kubernetes
    return {
        "namespace": cfg.kubernetes.namespace,
        "deployment": APP,
        "candidate_deployment": CANDIDATE,
        "service": APP,
    }


def stable_model(cfg: StackConfig) -> str:
    """The stable Deployment's file in the model volume: the rollout block's stable_model (a
    promotion moves it to the candidate's file), model.pt without a block."""
    return cfg.rollout.stable_model if cfg.rollout else RolloutSplit.stable_model


def gpu_node_labels() -> dict[str, str]:
    return {NODE_ROLE_TAG[0]: NODE_ROLE_TAG[1]}


def pod_resources(cfg: StackConfig) -> dict[str, dict[str, str]]:
    """Requests = limits (Guaranteed QoS: evicted last, never throttled below its share): one
    GPU, and the CPU and memory of one GPU's share of the smallest type the pool may start."""
    gpus = cfg.instance_type.gpu_count
    cpu = max(1, min(t.vcpu for t in cfg.instance_types) // gpus - RESERVED_CPU)
    memory = max(
        2, math.floor(min(t.ram_gib for t in cfg.instance_types) / gpus * POD_MEMORY_SHARE)
    )
    amounts = {"cpu": str(cpu), "memory": f"{memory}Gi", GPU_RESOURCE: "1"}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def namespace(cfg: StackConfig) -> dict[str, Any]:
    """The runtime's namespace under the `restricted` Pod Security Standard: the API server
    itself refuses a pod that runs as root, escalates, adds capabilities or uses the host."""
    assert cfg.kubernetes
    meta = _meta(cfg.kubernetes.namespace)
    meta["labels"].update(
        {
            f"pod-security.kubernetes.io/{mode}": "restricted"
            for mode in ("enforce", "audit", "warn")
        }
    )
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def service_account(cfg: StackConfig, placement: Placement) -> dict[str, Any]:
    assert cfg.kubernetes
    meta = _meta(APP, cfg.kubernetes.namespace)
    if placement.service_account_annotations:
        meta["annotations"] = dict(placement.service_account_annotations)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta,
        "automountServiceAccountToken": False,
    }


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def deployment(cfg: StackConfig, placement: Placement) -> dict[str, Any]:
    k = cfg.kubernetes
    assert k
    volumes: list[dict[str, Any]] = [
        # readOnlyRootFilesystem: the only writable places are these two scratch volumes
        # (tempfiles; CUDA's and torch's caches under HOME).
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": "2Gi"}},
        {"name": "api-token", "secret": {"secretName": TOKEN_SECRET, "defaultMode": 0o440}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME},
        {"name": "api-token", "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    if placement.model_claim:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": placement.model_claim, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    container = {
        "name": "runtime",
        "image": k.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": cfg.service_port, "protocol": "TCP"}],
        "env": [
            *runtime_env(
                host="0.0.0.0",
                port=cfg.service_port,
                device="cuda",
                model=f"{MODEL_DIR}/{stable_model(cfg)}",
                api_token_file=f"{TOKEN_DIR}/{TOKEN_KEY}",
                # A pod cannot reach the instance metadata (IMDSv2 hop limit 1 on
                # EKS, hardened mode on ACK): the node's handler drains it instead.
                spot_watch="off",
            ),
            {"name": "HOME", "value": HOME},
            # a shadow test (`torchfleet rollout --strategy shadow`): the file beside the model
            *(
                runtime_env(shadow_model=f"{MODEL_DIR}/{cfg.rollout.shadow_model}")
                if cfg.rollout and cfg.rollout.shadow_model
                else []
            ),
        ],
        "resources": pod_resources(cfg),
        "startupProbe": _probe(
            HEALTH_PATH, STARTUP_PERIOD_S, math.ceil(STARTUP_BUDGET_S / STARTUP_PERIOD_S)
        ),
        "readinessProbe": _probe(HEALTH_PATH, 5, 2, timeout=3),
        "livenessProbe": _probe("/livez", 10, 3),
        # Leave the load balancer's rotation before SIGTERM starts the drain.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spread = [
        # ScheduleAnyway: a node pool spans the zones and the autoscaler cannot ask it for a
        # zone, so a hard constraint could leave a pod pending with capacity elsewhere.
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(SELECTOR)},
        }
        for key in (ZONE_KEY, HOST_KEY)
    ]
    pod_spec = {
        "serviceAccountName": APP,
        "automountServiceAccountToken": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_s(),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": dict(placement.gpu_node_labels),
        "tolerations": [
            {
                "key": GPU_TAINT[0],
                "operator": "Equal",
                "value": GPU_TAINT[1],
                "effect": GPU_TAINT[2],
            }
        ],
        "topologySpreadConstraints": spread,
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(APP, k.namespace),
        "spec": {
            "replicas": k.replicas.min,
            "revisionHistoryLimit": 5,
            "progressDeadlineSeconds": STARTUP_BUDGET_S + 300,
            "selector": {"matchLabels": dict(SELECTOR)},
            # A new pod must be ready before an old one goes: capacity never dips on a rollout.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": dict(LABELS),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(cfg.service_port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def candidate_deployment(cfg: StackConfig, placement: Placement) -> dict[str, Any] | None:
    """The rollout's candidate beside the stable Deployment: the same pods on the candidate's
    file in the model volume, `track: candidate`, as many replicas as the split gives beside
    the stable's minimum (at most replicas.max less that minimum). The Service selects both
    (by name); the stable Deployment's own selector is left as it is (changing a selector
    replaces a Deployment), its ReplicaSets keep to their pods by pod-template-hash. None without a `rollout` block."""
    k, split = cfg.kubernetes, cfg.rollout
    if k is None or split is None:
        return None
    manifest = deployment(cfg, placement)
    spec = manifest["spec"]
    manifest["metadata"]["name"] = CANDIDATE
    # at most the GPUs the stable's minimum leaves below replicas.max: a split near 100 %
    # (a promotion's step) would otherwise ask for pods no node pool can place
    spec["replicas"] = split.candidate_size(k.replicas.min, k.replicas.max)
    spec["selector"]["matchLabels"][TRACK_LABEL] = "candidate"
    spec["template"]["metadata"]["labels"][TRACK_LABEL] = "candidate"
    (container,) = spec["template"]["spec"]["containers"]
    model_var = runtime_env(model="")[0]["name"]
    shadow_var = runtime_env(shadow_model="")[0]["name"]
    container["env"] = [v for v in container["env"] if v["name"] != shadow_var]  # stable's only
    for var in container["env"]:
        if var["name"] == model_var:
            var["value"] = f"{MODEL_DIR}/{split.candidate_model}"
    # spread the candidate's pods by their own labels, not the stable's
    for rule in spec["template"]["spec"]["topologySpreadConstraints"]:
        rule["labelSelector"] = {"matchLabels": {**SELECTOR, TRACK_LABEL: "candidate"}}
    return manifest


def token_secret(cfg: StackConfig, tokens: Any) -> dict[str, Any]:
    """The Secret of the API tokens (`tokens`: a Pulumi secret Output); only the runtime's pods
    mount it (no role of the namespace reads Secrets)."""
    assert cfg.kubernetes
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(TOKEN_SECRET, cfg.kubernetes.namespace),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: tokens},
    }


def service_ports(cfg: StackConfig) -> list[dict[str, Any]]:
    """https (443) where the cloud's load balancer ends TLS (its annotations: infra/aws and
    infra/alicloud cluster.py) and http (80) only beside it to redirect (ACK's CLB; EKS's NLB
    cannot redirect, so it has no http port); plain http without a certificate."""
    names = {edge.HTTPS_PORT: "https", edge.HTTP_PORT: "http"}
    return [
        {"name": names[port], "port": port, "targetPort": "http", "protocol": "TCP"}
        for port in edge.lb_ports(cfg, can_redirect=cfg.cloud == "alicloud")
    ]


def service(cfg: StackConfig, placement: Placement) -> dict[str, Any]:
    """The cloud's load balancer in front of the ready pods; it answers only the client CIDRs
    (or the VPC when none are named, and is then internal)."""
    assert cfg.kubernetes
    meta = _meta(APP, cfg.kubernetes.namespace, annotations=dict(placement.service_annotations))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "LoadBalancer",
            "selector": dict(SELECTOR),
            "ports": service_ports(cfg),
            # Local: the client address survives (source ranges apply to it) and the LB's health
            # check skips nodes without a ready pod.
            "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": list(cfg.client_cidrs or (cfg.vpc_cidr,)),
        },
    }


def disruption_budget(cfg: StackConfig) -> dict[str, Any]:
    """One pod at a time: node drains (spot notice, scale-down, upgrades) proceed, never all
    at once, and a pod stuck unready cannot block a drain."""
    assert cfg.kubernetes
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(APP, cfg.kubernetes.namespace),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(SELECTOR)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


QUEUE_METRIC = "torchfleet_queue_depth"
# The runtime's NVML gauge (its `gpu` extra, in the image by default for CUDA profiles): a pod
# has one GPU, so its value is the pod's GPU saturation.
GPU_METRIC = "torchfleet_gpu_utilization_ratio"


def autoscaler(cfg: StackConfig) -> dict[str, Any]:
    """Pods follow the runtime's queue depth and their GPU's utilisation (both served per pod
    by the Prometheus adapter; the HPA takes the larger of the two proposals, so either adds
    pods and both must allow removing one): scale up at once, down only after five quiet
    minutes (a GPU pod takes minutes to warm)."""
    k = cfg.kubernetes
    assert k
    gpu_target = f"{round(k.gpu_utilization_target * 10)}m"  # percent -> a ratio in milli-units
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(APP, k.namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP},
            "minReplicas": k.replicas.min,
            "maxReplicas": k.replicas.max,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(k.queue_target)},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": GPU_METRIC},
                        "target": {"type": "AverageValue", "averageValue": gpu_target},
                    },
                },
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [
                        {"type": "Pods", "value": 2, "periodSeconds": 60},
                        {"type": "Percent", "value": 100, "periodSeconds": 60},
                    ],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "selectPolicy": "Min",
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def model_volume(
    cfg: StackConfig, name: str, csi: dict[str, Any], mount_options: list[str] | None = None
) -> dict[str, Any]:
    """The pre-provisioned, read-only volume `model_claim` binds; each cloud gives its CSI block
    (the bucket driver) and mount options."""
    assert cfg.kubernetes
    spec: dict[str, Any] = {
        "capacity": {"storage": "10Gi"},  # required by the API, ignored by the driver
        "accessModes": ["ReadOnlyMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "claimRef": {"namespace": cfg.kubernetes.namespace, "name": MODEL_CLAIM},
    }
    if mount_options:
        spec["mountOptions"] = mount_options
    spec["csi"] = csi
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": PROJECT}},
        "spec": spec,
    }


def model_claim(cfg: StackConfig, volume_name: str) -> dict[str, Any]:
    """A claim bound to the pre-provisioned, read-only volume holding the model."""
    assert cfg.kubernetes
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(MODEL_CLAIM, cfg.kubernetes.namespace),
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
