"""`torchfleet up|status` on a `mode: kubernetes` stack: the runtime's objects read on the cluster.

No inventory and no converge here: the cluster runs the runtime image, Pulumi applied its
manifests (infra/k8s/). What is read comes from the stack's outputs: `kubeconfig` (a secret
output: EKS's calls `aws eks get-token`, ACK's carries a temporary credential) and `workload`
(infra/k8s/workload.names: namespace, the stable and candidate Deployments, the Service).

Readiness: the stable Deployment's available replicas reach its desired count AND the Service's
load balancer has an ingress hostname or IP, polled every `poll_s` until `timeout_s` (the clock
and the sleep are injectable); a timeout is a StageError naming what was missing with its
numbers. The smoke prediction then goes through that load balancer (infra/deploy/smoke.py) with
the stack's API token. `status` reads the same once, plus the candidate Deployment (labelled
`track: candidate`) when a rollout's split has one.

The client is the official `kubernetes` package (requirements/infra.txt), built from the
kubeconfig dict without writing it anywhere (new_client_from_config_dict, persist_config off).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from infra import client, edge
from infra.config import StackConfig
from infra.deploy import smoke
from infra.deploy.progress import Console
from infra.deploy.stage import StageError
from infra.deploy.summary import Summary

READY_TIMEOUT_S = 1500.0  # node pool scale-up, image pull, the runtime's warm-up (STARTUP_BUDGET_S)
POLL_S = 10.0
REQUEST_TIMEOUT_S = 15  # one API call


@dataclass(frozen=True)
class Names:
    """Where the runtime's objects are (the stack's `workload` output)."""

    namespace: str
    deployment: str
    candidate_deployment: str
    service: str

    @classmethod
    def of(cls, outputs: dict[str, Any], cfg: StackConfig | None) -> Names:
        doc = outputs.get("workload")
        if not doc and cfg is not None and cfg.kubernetes is not None:
            from infra.k8s import workload  # a stack whose last `up` predates the output

            doc = workload.names(cfg)
        try:
            return cls(**{k: str(doc[k]) for k in cls.__dataclass_fields__})  # type: ignore[index]
        except (KeyError, TypeError):
            raise StageError(
                "inventory",
                f"the stack's `workload` output is missing or incomplete: {doc!r}",
                fix="`torchfleet up` (or `pulumi up`) writes it; then re-run",
            ) from None


@dataclass(frozen=True)
class Replicas:
    """A Deployment's counts as its status says them (None: the Deployment does not exist)."""

    name: str
    desired: int
    ready: int
    available: int
    updated: int

    @property
    def complete(self) -> bool:
        return self.desired > 0 and self.available >= self.desired

    def describe(self) -> str:
        return (
            f"Deployment {self.name}: {self.available}/{self.desired} available, "
            f"{self.ready} ready, {self.updated} updated"
        )


@dataclass(frozen=True)
class Look:
    """One look at the workload: the stable Deployment, the candidate, the Service's address."""

    stable: Replicas | None
    candidate: Replicas | None
    address: str | None  # the load balancer's ingress hostname or IP
    error: str | None = None  # the API's answer when it could not be read

    def missing(self, names: Names) -> list[str]:
        where = names.namespace
        out = []
        if self.error:
            out.append(f"the Kubernetes API: {self.error}")
        elif self.stable is None:
            out.append(f"Deployment {where}/{names.deployment}: not found")
        elif not self.stable.complete:
            out.append(self.stable.describe())
        if not self.error and not self.address:
            out.append(f"Service {where}/{names.service}: no load-balancer ingress yet")
        return out

    def lines(self, names: Names) -> list[str]:
        if self.error:
            return [f"the Kubernetes API: {self.error}"]
        out = [
            self.stable.describe()
            if self.stable
            else f"Deployment {names.namespace}/{names.deployment}: not found"
        ]
        if self.candidate and self.candidate.desired:
            out.append(self.candidate.describe() + " (track: candidate)")
        out.append(
            f"Service {names.namespace}/{names.service}: load balancer "
            + (self.address or "pending (no ingress yet)")
        )
        return out


def _unless_missing(read: Callable[[], Any]) -> Any:
    """What `read` returns from the Kubernetes API, or None where the object does not exist."""
    from kubernetes.client.exceptions import ApiException

    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


class Cluster:
    """The reads this module makes, through the official client."""

    def __init__(self, kubeconfig: str | dict[str, Any]) -> None:
        from kubernetes import client as kube
        from kubernetes import config as kube_config

        doc = yaml.safe_load(kubeconfig) if isinstance(kubeconfig, str) else kubeconfig
        if not isinstance(doc, dict) or not doc.get("clusters"):
            raise StageError(
                "inventory",
                "the stack's `kubeconfig` output is not a kubeconfig (no clusters)",
                fix="`pulumi stack output --show-secrets kubeconfig` shows it; `torchfleet up` "
                "rewrites it",
            )
        api = kube_config.new_client_from_config_dict(doc, persist_config=False)
        self.apps, self.core = kube.AppsV1Api(api), kube.CoreV1Api(api)

    def replicas(self, namespace: str, name: str) -> Replicas | None:
        d = _unless_missing(
            lambda: self.apps.read_namespaced_deployment(
                name, namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        )
        if d is None:
            return None
        s = d.status
        return Replicas(
            f"{namespace}/{name}",
            int(d.spec.replicas or 0),
            int(s.ready_replicas or 0),
            int(s.available_replicas or 0),
            int(s.updated_replicas or 0),
        )

    def address(self, namespace: str, name: str) -> str | None:
        svc = _unless_missing(
            lambda: self.core.read_namespaced_service(
                name, namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        )
        if svc is None:
            return None
        lb = svc.status.load_balancer if svc.status else None
        for ingress in (lb.ingress if lb else None) or []:
            if ingress.hostname or ingress.ip:
                return str(ingress.hostname or ingress.ip)
        return None

    def look(self, names: Names) -> Look:
        try:
            return Look(
                self.replicas(names.namespace, names.deployment),
                self.replicas(names.namespace, names.candidate_deployment),
                self.address(names.namespace, names.service),
            )
        except Exception as err:  # the API's refusals, the network, the exec plugin
            reason = getattr(err, "reason", None)
            status = getattr(err, "status", None)
            what = f"{status} {reason}" if status else f"{type(err).__name__}: {err}"
            return Look(None, None, None, error=what[:300])


def cluster_of(outputs: dict[str, Any]) -> Cluster:
    kubeconfig = outputs.get("kubeconfig")
    if not kubeconfig:
        raise StageError(
            "inventory",
            "the stack has no `kubeconfig` output (mode: kubernetes exports one)",
            fix="`torchfleet up` (or `pulumi up`) writes it; then re-run",
        )
    return Cluster(kubeconfig)


def wait(
    cluster: Cluster,
    names: Names,
    console: Console,
    timeout_s: float = READY_TIMEOUT_S,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Look:
    """Until the stable Deployment is complete and the Service has its address; a StageError
    naming what was missing after `timeout_s`."""
    started = clock()
    last: list[str] | None = None
    while True:
        look = cluster.look(names)
        waited = clock() - started
        missing = look.missing(names)
        shown = look.lines(names)
        if shown != last:
            for line in shown:
                console.line(f"  {line} (after {waited:.0f} s)")
            last = shown
        if not missing:
            return look
        if waited >= timeout_s:
            raise StageError(
                "readiness",
                f"the runtime on the cluster was not ready within {timeout_s:.0f} s: "
                + "; ".join(missing),
                details=missing,
                fix=f"`kubectl -n {names.namespace} describe deployment {names.deployment}` and "
                f"`kubectl -n {names.namespace} get events` say why (pending pods: no GPU node "
                "yet; CrashLoopBackOff: the runtime's log), then re-run; --ready-timeout waits "
                "longer",
            )
        sleep(poll_s)


def endpoint_of(look: Look, outputs: dict[str, Any], cfg: StackConfig | None) -> str:
    """The endpoint through the Service's load balancer (the output's, when no config)."""
    if look.address and cfg is not None:
        return edge.endpoint(cfg, look.address)
    return str(outputs.get("endpoint") or "")


@dataclass
class Options:
    timeout_s: float = READY_TIMEOUT_S
    poll_s: float = POLL_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # where a request to the endpoint goes (tests: the fake load balancer's loopback address)
    resolve: Callable[[str], str] | None = None


def stages(
    outputs: dict[str, Any],
    cfg: StackConfig | None,
    steps: Any,
    console: Console,
    summary: Summary,
    auth: client.Auth,
    opts: Options | None = None,
) -> Summary:
    """`up` after provision on a kubernetes stack: kubeconfig -> (no converge) -> readiness ->
    smoke."""
    opts = opts or Options()
    names = Names.of(outputs, cfg)
    with steps("kubeconfig", "the cluster's kubeconfig and the workload from the stack outputs"):
        cluster = cluster_of(outputs)
        console.line(
            f"  namespace {names.namespace}: Deployment {names.deployment}, Service "
            f"{names.service} (no inventory: the cluster runs the runtime image)"
        )
    with steps("converge", "kubernetes mode: nothing to converge"):
        console.line(
            "  skipped here: Pulumi applied the runtime's manifests (infra/k8s/); no node runs "
            "site.yml"
        )
    with steps(
        "readiness",
        f"Deployment {names.deployment} available = desired and the Service's load balancer "
        f"has an address (at most {opts.timeout_s:.0f} s)",
    ):
        look = wait(cluster, names, console, opts.timeout_s, opts.poll_s, opts.clock, opts.sleep)
        summary.pods = look.lines(names)
    endpoint = endpoint_of(look, outputs, cfg)
    summary.outputs = {**summary.outputs, "endpoint": endpoint}
    with steps("smoke", f"one prediction through the load balancer {endpoint}"):
        base = opts.resolve(endpoint) if opts.resolve else endpoint
        summary.prediction = smoke.predict(base, endpoint, "direct", auth)
        console.line(f"  {summary.prediction.describe()}")
    return summary


def status_of(outputs: dict[str, Any], cfg: StackConfig | None, summary: Summary) -> Summary:
    """One look, no waiting: the Deployments' replicas and the Service's endpoint."""
    names = Names.of(outputs, cfg)
    look = cluster_of(outputs).look(names)
    summary.pods = look.lines(names)
    summary.unready = look.missing(names)
    if look.address:
        summary.outputs = {**summary.outputs, "endpoint": endpoint_of(look, outputs, cfg)}
    return summary
