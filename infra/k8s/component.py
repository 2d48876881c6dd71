"""The component that puts the runtime on a cluster: Helm releases first, then the runtime's
manifests (workload.py), all through one pulumi_kubernetes provider built from the cluster's
kubeconfig.

Order: the add-on namespace, the Helm releases (each in the namespace its chart expects), the
runtime namespace, its service account and model volume, the Deployment (after the device
plugin: without it no node offers nvidia.com/gpu), its Service and PDB, and the HPA (after the
Prometheus adapter that serves its metric). A Deployment may take minutes to warm, so the
provider waits for it longer than its default.

`deploy_kubernetes(cfg, cluster)` is the one path of `mode: kubernetes` on either cloud: a
cloud's cluster component (infra/aws/cluster.py EksCluster, infra/alicloud/cluster.py AckCluster)
meets the small `Cluster` protocol below, and the runtime goes on it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pulumi
import pulumi_kubernetes as k8s

from infra import edge
from infra.config import StackConfig
from infra.constants import PROJECT
from infra.interface import Deployment
from infra.k8s import addons, workload
from infra.k8s.addons import Release
from infra.k8s.cost import cluster_cost
from infra.k8s.workload import MODEL_CLAIM, Placement

# pulumi_kubernetes class per (apiVersion, kind) of the manifests this mode registers.
KINDS = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "PersistentVolume"): k8s.core.v1.PersistentVolume,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): k8s.autoscaling.v2.HorizontalPodAutoscaler,
}
# The rollout waits for warm-up: the startup budget plus image pull and scheduling.
DEPLOYMENT_TIMEOUT_S = workload.STARTUP_BUDGET_S + 600
RELEASE_TIMEOUT_S = 900
_ARGS = {
    "metadata": "metadata",
    "spec": "spec",
    "automountServiceAccountToken": "automount_service_account_token",
    "type": "type",
    "stringData": "string_data",
}


def register(name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> Any:
    """One manifest as its pulumi_kubernetes resource, fields passed through unchanged."""
    cls = KINDS[(manifest["apiVersion"], manifest["kind"])]
    args = {_ARGS[k]: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    return cls(name, **args, opts=opts)


def addon_namespace() -> dict[str, Any]:
    # Third-party charts do not all meet `restricted`; `baseline` still refuses host access.
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": addons.ADDON_NAMESPACE,
            "labels": {
                "app.kubernetes.io/part-of": PROJECT,
                "pod-security.kubernetes.io/enforce": "baseline",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }


class KubernetesApp(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        kubeconfig: pulumi.Input[str],
        placement: Placement,
        releases: Sequence[Release],
        volumes: Sequence[dict[str, Any]] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:k8s:App", name, None, opts)
        assert cfg.kubernetes
        self.provider = k8s.Provider(
            f"{name}-provider",
            kubeconfig=kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        child = pulumi.ResourceOptions(parent=self, provider=self.provider)

        def after(*deps: pulumi.Resource | None) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[d for d in deps if d is not None])
            )

        system_ns = register(f"{name}-ns-system", addon_namespace(), child)
        self.releases: dict[str, k8s.helm.v3.Release] = {}
        for spec in releases:
            self.releases[spec.key] = self._release(name, spec, after(system_ns))

        ns = register(f"{name}-ns", workload.namespace(cfg), child)
        account = register(f"{name}-sa", workload.service_account(cfg, placement), after(ns))
        self.token = edge.token(cfg, pulumi.ResourceOptions(parent=self))
        tokens = register(
            f"{name}-api-token",
            workload.token_secret(cfg, edge.accepted(cfg, self.token)),
            pulumi.ResourceOptions.merge(
                after(ns), pulumi.ResourceOptions(additional_secret_outputs=["stringData"])
            ),
        )
        claims = []
        for i, volume in enumerate(volumes):
            claims.append(register(f"{name}-model-pv-{i}", volume, child))
        if placement.model_claim:
            claims.append(
                register(
                    f"{name}-model-pvc",
                    workload.model_claim(cfg, volumes[0]["metadata"]["name"]),
                    after(ns, *claims),
                )
            )

        manifest = workload.deployment(cfg, placement)
        manifest["metadata"]["annotations"] = {
            "pulumi.com/timeoutSeconds": str(DEPLOYMENT_TIMEOUT_S)
        }
        self.deployment = register(
            f"{name}-deployment",
            manifest,
            after(ns, account, tokens, *claims, self.releases.get("device_plugin")),
        )
        candidate = workload.candidate_deployment(cfg, placement)
        if candidate is not None:
            candidate["metadata"]["annotations"] = dict(manifest["metadata"]["annotations"])
            register(
                f"{name}-candidate",
                candidate,
                after(ns, account, tokens, *claims, self.releases.get("device_plugin")),
            )
        self.service = register(f"{name}-service", workload.service(cfg, placement), after(ns))
        register(f"{name}-pdb", workload.disruption_budget(cfg), after(ns))
        register(
            f"{name}-hpa",
            workload.autoscaler(cfg),
            after(self.deployment, self.releases.get("prometheus_adapter")),
        )
        self.register_outputs({})

    def _release(
        self, name: str, spec: Release, opts: pulumi.ResourceOptions
    ) -> k8s.helm.v3.Release:
        chart = spec.chart
        repo = None if chart.oci else k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo)
        return k8s.helm.v3.Release(
            f"{name}-{spec.key.replace('_', '-')}",
            name=chart.name,
            chart=f"{chart.repo}/{chart.name}" if chart.oci else chart.name,
            version=chart.version,
            repository_opts=repo,
            namespace=spec.namespace,
            values=spec.values,
            atomic=True,
            cleanup_on_fail=True,
            max_history=5,
            timeout=RELEASE_TIMEOUT_S,
            opts=opts,
        )


def lb_endpoint(status: Any, cfg: StackConfig) -> str:
    """The Service's load-balancer address once the cloud has assigned one."""
    try:
        ingress = status.load_balancer.ingress[0]
        return edge.endpoint(cfg, ingress.hostname or ingress.ip)
    except (AttributeError, IndexError, TypeError):
        return "pending (the load balancer gets its address when the Service is created)"


class Cluster(Protocol):
    """What a cloud's cluster component gives the runtime."""

    kubeconfig: pulumi.Output[str]

    def model_volume(self) -> tuple[str | None, list[dict[str, Any]]]:
        """The model's persistent volume name (None: no model volume) and its manifests."""
        ...

    def placement(self, model_claim: str | None) -> Placement: ...

    def releases(self) -> list[Release]:
        """The Helm releases this cloud's cluster needs beside the runtime."""
        ...

    def node_pools(self) -> list[pulumi.Resource]:
        """The node groups the runtime waits for."""
        ...

    def facts(self) -> dict[str, Any]:
        """This cloud's entries of the stack's `cluster` output (its name, id or endpoint,
        version)."""
        ...


def deploy_kubernetes(cfg: StackConfig, cluster: Cluster) -> Deployment:
    """The runtime on `cluster` and the stack's outputs; the caller adds the teardown."""
    assert cfg.kubernetes
    volume, volumes = cluster.model_volume()
    app = KubernetesApp(
        "app",
        cfg,
        cluster.kubeconfig,
        cluster.placement(MODEL_CLAIM if volume else None),
        cluster.releases(),
        volumes,
        opts=pulumi.ResourceOptions(depends_on=cluster.node_pools()),
    )
    return Deployment(
        nodes=[],
        endpoint=app.service.status.apply(lambda status: lb_endpoint(status, cfg)),
        login_user="",
        extra_outputs={
            "cluster": {
                **cluster.facts(),
                "spot_caps_per_hour": {t.name: cfg.spot_cap(t) for t in cfg.instance_types}
                if cfg.spot.enabled
                else {},
                "currency": cfg.currency,
            },
            "kubeconfig": pulumi.Output.secret(cluster.kubeconfig),
            "cluster_cost": cluster_cost(cfg).as_dict(),
            "api_token": app.token,
        },
    )
