"""mode: kubernetes under the mock engine: both example stacks (aws-k8s on EKS, alicloud-k8s on
ACK) and a dev/prod variant of each register a cluster, GPU node pools under the price cap and
the runtime's Kubernetes objects; every manifest the mocks saw validates against the OpenAPI
schema of the cluster's Kubernetes version (kubernetes-validate, strict); policies check the
pods (probes, drain grace, GPU request, non-root, no host access, limits, spread), the PDB, the
HPA, the load balancer, the nodes (IMDSv2, encrypted disks), roles and schedules.

Every policy counts what it checked and fails when it checked nothing (the pattern of
test_policy.py), so a program that stops registering a kind cannot pass by silence.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
from torchfleet_compat import runtime_settings
from torchfleet_compat.runtime_settings import ENV_PREFIX, FIELDS

from infra.catalog import lookup
from infra.config import ConfigError
from infra.k8s import settings as k8s_settings
from infra.lifecycle import GPU_TARGET_DEFAULT
from infra.offline import OfflineMocks, RecordingMonitor, run_offline
from infra.plan import KUBERNETES_STACKS

AWS_SPOT_NOTICE_S = 120  # the shortest notice a node gets before it goes (docs/contracts/node.md)
HELM = "kubernetes:helm.sh/v3:Release"
CLUSTER_TYPE = {
    "aws": "aws:eks/cluster:Cluster",
    "alicloud": "alicloud:cs/managedKubernetes:ManagedKubernetes",
}
POOL_TYPE = {"aws": "aws:eks/nodeGroup:NodeGroup", "alicloud": "alicloud:cs/nodePool:NodePool"}
KINDS = {
    "Namespace",
    "ServiceAccount",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "PersistentVolume",
    "PersistentVolumeClaim",
}
DRAIN_DEFAULT_S = runtime_settings.defaults()["drain_timeout_s"]
# kubernetes-validate re-reads its 1.5 MB definitions file on every call; the file does not
# change within a run, so read it once (the validation itself is untouched).
kubernetes_validate.utils.schema_contents = functools.cache(
    kubernetes_validate.utils.schema_contents
)


def variants(with_overrides) -> dict[str, dict[str, Any]]:
    """The examples, plus the other env of each (aws-k8s is dev, alicloud-k8s prod)."""
    return {
        "aws-k8s": with_overrides("aws-k8s"),
        "aws-k8s:prod": with_overrides(
            "aws-k8s",
            env="prod",
            ttl_hours=None,
            schedule=None,
            spot={"enabled": True, "max_price_ratio": 1.0, "on_demand_base": 1},
            nodes={"min": 2, "desired": 2, "max": 4},
        ),
        "alicloud-k8s": with_overrides("alicloud-k8s"),
        "alicloud-k8s:dev": with_overrides(
            "alicloud-k8s",
            env="dev",
            ttl_hours=8,
            schedule={
                "timezone": "Asia/Shanghai",
                "start": "09:00",
                "stop": "21:00",
                "days": "MON-FRI",
            },
        ),
    }


@pytest.fixture(scope="module")
def k8s_runs(with_overrides):
    out = {}
    for key, values in variants(with_overrides).items():
        stack = key.split(":")[0]
        out[key] = (run_offline(stack, values), values)
    return out


@pytest.fixture(params=["aws-k8s", "aws-k8s:prod", "alicloud-k8s", "alicloud-k8s:dev"])
def k(request, k8s_runs):
    run, values = k8s_runs[request.param]
    cfg = {key.split(":", 1)[1]: v for key, v in values.items()}
    return run, cfg


def _ints(value: Any) -> Any:
    """The mock engine hands numbers back as floats; a manifest says 1, not 1.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _ints(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def manifests(run) -> list[dict[str, Any]]:
    """Every Kubernetes object the program registered, as the manifest the API server gets."""
    out = []
    for r in run.custom():
        if r.type.startswith("kubernetes:") and r.type != HELM:
            assert {"apiVersion", "kind", "metadata"} <= set(r.inputs), (r.type, r.name)
            out.append(_ints(r.inputs))
    return out


def of_kind(run, kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests(run) if m["kind"] == kind]


def pod_specs(run):
    for d in of_kind(run, "Deployment"):
        yield d, d["spec"]["template"]["spec"]


def each_container(run):
    """(pod spec, container) of every Deployment; fails once exhausted if there was none, so a
    policy looping over it cannot pass having checked nothing."""
    found = 0
    for _, pod in pod_specs(run):
        for c in pod["containers"]:
            found += 1
            yield pod, c
    assert found, f"{run.stack}: no container to check"


# -- what each stack registers ------------------------------------------------------------------


def test_registers_cluster_gpu_pools_and_kubernetes_objects(k):
    run, cfg = k
    cloud = cfg["cloud"]
    types = {r.type for r in run.custom()}
    assert CLUSTER_TYPE[cloud] in types
    pools = [r for r in run.of_type(POOL_TYPE[cloud]) if "gpu" in r.name]
    assert pools, f"{run.stack}: no GPU node pool"
    assert {m["kind"] for m in manifests(run)} >= KINDS
    releases = {r.name.removeprefix("app-").replace("-", "_") for r in run.of_type(HELM)}
    assert releases == set(k8s_settings.CHARTS_BY_CLOUD[cloud])
    components = {r.type for r in run.resources if r.type.startswith("torchfleet:")}
    assert components == {
        f"torchfleet:{cloud}:Network",
        f"torchfleet:{cloud}:Cluster",
        f"torchfleet:{cloud}:Teardown",
        "torchfleet:k8s:App",
    }
    parents = {r.urn: r.type for r in run.resources}
    for r in run.custom():
        assert parents.get(r.parent, "").startswith("torchfleet:"), (r.type, r.name)


def test_every_manifest_validates_against_the_cluster_versions_schema(k):
    run, cfg = k
    version = cfg["kubernetes"]["version"]
    (cluster,) = run.of_type(CLUSTER_TYPE[cfg["cloud"]])
    # The cluster runs the version the manifests are checked against.
    assert str(cluster.inputs["version"]).startswith(version)
    checked = 0
    for m in manifests(run):
        used = kubernetes_validate.validate(m, version, strict=True)
        assert used == version, f"validated against {used}, the cluster runs {version}"
        checked += 1
    assert checked >= len(KINDS)


def test_validation_can_fail(k8s_runs):
    """The schema check is not a formality: a misspelt field or a wrong type is refused."""
    run, values = k8s_runs["aws-k8s"]
    version = values["torchfleet:kubernetes"]["version"]
    (deployment,) = of_kind(run, "Deployment")
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, version, strict=True)
    wrong = json.loads(json.dumps(deployment))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, version, strict=True)


def test_helm_releases_are_pinned(k):
    run, cfg = k
    checked = 0
    for r in run.of_type(HELM):
        assert k8s_settings._CHART_VERSION_RE.match(r.inputs["version"]), r.inputs["version"]
        chart = r.inputs["chart"]
        assert chart.startswith("oci://") or r.inputs["repositoryOpts"]["repo"].startswith(
            "https://"
        ), r.name
        assert r.inputs["atomic"] is True
        checked += 1
    assert checked >= 2


# -- pods -------------------------------------------------------------------------------------


def test_probes_and_startup_budget(k):
    run, cfg = k
    for _, c in each_container(run):
        port = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert port["http"] == cfg["service_port"]
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
        startup = c["startupProbe"]
        assert startup["httpGet"]["path"] == "/readyz"
        # warm-up takes minutes on a GPU: liveness must not kill a warming pod
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_grace_period_covers_prestop_and_the_runtimes_drain(k):
    run, _ = k
    for pod, c in each_container(run):
        grace = pod["terminationGracePeriodSeconds"]
        pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pre >= 5  # the load balancer stops sending before the drain starts
        assert grace >= pre + DRAIN_DEFAULT_S + 10, (grace, pre, DRAIN_DEFAULT_S)
        assert grace <= AWS_SPOT_NOTICE_S, "a drain longer than the spot notice is cut short"


def test_gpu_request_and_resource_limits(k):
    run, cfg = k
    itype = lookup(cfg["cloud"], cfg["instance_type"])
    for _, c in each_container(run):
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        assert lim["nvidia.com/gpu"] == req["nvidia.com/gpu"] == "1"
        assert {"cpu", "memory"} <= set(req) and {"cpu", "memory"} <= set(lim)
        assert req == lim  # Guaranteed QoS
        assert int(lim["cpu"]) < itype.vcpu  # room for the kubelet and node daemons
        assert int(lim["memory"].removesuffix("Gi")) < itype.ram_gib


def test_pods_run_as_non_root_without_host_access(k):
    run, _ = k
    for pod, c in each_container(run):
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        assert not [v for v in pod["volumes"] if "hostPath" in v]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged")
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert not [p for p in c["ports"] if p.get("hostPort")]
    (ns,) = [
        n
        for n in of_kind(run, "Namespace")
        if n["metadata"]["name"] == of_kind(run, "Deployment")[0]["metadata"]["namespace"]
    ]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_runtime_environment_names_real_runtime_keys(k):
    run, _ = k
    known = {ENV_PREFIX + key.upper() for key in FIELDS} | {"HOME"}
    for _, c in each_container(run):
        env = {e["name"]: e["value"] for e in c["env"]}
        assert set(env) <= known, set(env) - known
        assert env["TORCHFLEET_DEVICE"] == "cuda" and env["TORCHFLEET_HOST"] == "0.0.0.0"


def test_spread_across_zones_and_gpu_placement(k):
    run, _ = k
    checked = 0
    for d, pod in pod_specs(run):
        labels = d["spec"]["template"]["metadata"]["labels"]
        zone = [
            t
            for t in pod["topologySpreadConstraints"]
            if t["topologyKey"] == "topology.kubernetes.io/zone"
        ]
        assert zone and zone[0]["maxSkew"] == 1
        assert zone[0]["labelSelector"]["matchLabels"].items() <= labels.items()
        assert pod["nodeSelector"] == {"torchfleet-role": "gpu-node"}
        assert {
            "key": "nvidia.com/gpu",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        } in pod["tolerations"]
        assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        checked += 1
    assert checked >= 1


def test_disruption_budget_protects_without_blocking_drains(k):
    run, _ = k
    (d,) = of_kind(run, "Deployment")
    labels = d["spec"]["template"]["metadata"]["labels"]
    checked = 0
    for pdb in of_kind(run, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert (
            pdb["spec"].get("maxUnavailable", 0) >= 1
            or pdb["spec"]["minAvailable"] < d["spec"]["replicas"]
        )
        assert pdb["metadata"]["namespace"] == d["metadata"]["namespace"]
        checked += 1
    assert checked == 1


def test_hpa_follows_queue_depth_within_gpu_capacity(k):
    run, cfg = k
    gpus = lookup(cfg["cloud"], cfg["instance_type"]).gpu_count
    checked = 0
    for hpa in of_kind(run, "HorizontalPodAutoscaler"):
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": of_kind(run, "Deployment")[0]["metadata"]["name"],
        }
        targets = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in spec["metrics"]}
        assert set(targets) == {"torchfleet_queue_depth", "torchfleet_gpu_utilization_ratio"}
        queue, gpu = targets["torchfleet_queue_depth"], targets["torchfleet_gpu_utilization_ratio"]
        assert queue["averageValue"] == str(cfg["kubernetes"]["queue_target"])
        # percent in the config, a ratio in milli-units on the pod metric (70 % -> 700m)
        percent = cfg["kubernetes"].get("gpu_utilization_target", GPU_TARGET_DEFAULT)
        assert gpu == {"type": "AverageValue", "averageValue": f"{round(percent * 10)}m"}
        replicas = cfg["kubernetes"]["replicas"]  # the stack's own bounds, passed through
        assert (spec["minReplicas"], spec["maxReplicas"]) == (replicas["min"], replicas["max"])
        assert spec["maxReplicas"] <= cfg["nodes"]["max"] * gpus  # never more pods than GPUs
        assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 120
        checked += 1
    assert checked == 1
    (adapter,) = [r for r in run.of_type(HELM) if r.name.endswith("prometheus-adapter")]
    rules = adapter.inputs["values"]["rules"]["custom"]
    served = {r["name"]["as"] for r in rules}
    assert served == {"torchfleet_queue_depth", "torchfleet_gpu_utilization_ratio"}
    for rule in rules:  # per pod, as the HPA's Pods metrics ask
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        assert rule["metricsQuery"].endswith("by (<<.GroupBy>>)")


def test_service_faces_only_named_clients(k):
    run, cfg = k
    checked = 0
    for svc in of_kind(run, "Service"):
        spec = svc["spec"]
        assert spec["type"] == "LoadBalancer" and spec["externalTrafficPolicy"] == "Local"
        assert spec["loadBalancerSourceRanges"] == (cfg.get("client_cidrs") or ["10.42.0.0/16"])
        annotations = svc["metadata"]["annotations"]
        if cfg["cloud"] == "aws":
            internal = annotations.get("service.beta.kubernetes.io/aws-load-balancer-internal")
            assert (internal == "true") is (not cfg.get("client_cidrs"))
        else:
            kind = annotations["service.beta.kubernetes.io/alibaba-cloud-loadbalancer-address-type"]
            assert kind == ("internet" if cfg.get("client_cidrs") else "intranet")
            if cfg.get("client_cidrs"):
                (acl,) = run.of_type("alicloud:slb/acl:Acl")
                assert [e["entry"] for e in acl.inputs["entryLists"]] == cfg["client_cidrs"]
        checked += 1
    assert checked == 1


def test_internal_load_balancer_without_client_cidrs(with_overrides):
    run = run_offline("aws-k8s", with_overrides("aws-k8s", client_cidrs=None))
    (svc,) = of_kind(run, "Service")
    assert (
        svc["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-internal"]
        == "true"
    )
    assert svc["spec"]["loadBalancerSourceRanges"] == ["10.42.0.0/16"]
    tags = {t.inputs["key"] for t in run.of_type("aws:ec2/tag:Tag")}
    assert tags == {"kubernetes.io/role/internal-elb"}


def test_model_volume_is_read_only(k):
    run, cfg = k
    checked = 0
    for pv in of_kind(run, "PersistentVolume"):
        assert pv["spec"]["accessModes"] == ["ReadOnlyMany"] and pv["spec"]["csi"]["readOnly"]
        checked += 1
    for _, pod in pod_specs(run):
        (mount,) = [m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "model"]
        assert mount["mountPath"] == "/models" and mount["readOnly"] is True
        checked += 1
    assert checked == 2


# -- nodes, price caps, cluster ---------------------------------------------------------------


def _cap(cfg: dict, itype: str) -> float:
    return cfg["spot"]["max_price_ratio"] * lookup(cfg["cloud"], itype).usd_per_hour


def test_gpu_pools_have_spot_under_the_cap_and_on_demand(k):
    run, cfg = k
    checked = 0
    if cfg["cloud"] == "aws":
        groups = {
            r.inputs["capacityType"]: r for r in run.of_type(POOL_TYPE["aws"]) if "gpu" in r.name
        }
        assert set(groups) == {"SPOT", "ON_DEMAND"}
        base = cfg["spot"].get("on_demand_base", 0)
        assert groups["ON_DEMAND"].inputs["scalingConfig"]["minSize"] == base
        assert groups["SPOT"].inputs["scalingConfig"]["maxSize"] == cfg["nodes"]["max"] - base
        for g in groups.values():
            assert g.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
            assert g.inputs["instanceTypes"][0] == cfg["instance_type"]
        # EKS enforces no cap below on-demand: the stack allows only the one EC2 enforces.
        assert cfg["spot"]["max_price_ratio"] == 1.0
        caps = run.outputs["cluster"]["spot_caps_per_hour"]
        for itype, cap in caps.items():
            assert 0 < cap <= _cap(cfg, itype) + 1e-9
            checked += 1
    else:
        (pool,) = [r for r in run.of_type(POOL_TYPE["alicloud"]) if r.name.endswith("-gpu")]
        assert pool.inputs["spotStrategy"] == "SpotWithPriceLimit"
        assert pool.inputs["onDemandBaseCapacity"] == cfg["spot"]["on_demand_base"]
        assert pool.inputs["spotInstanceRemedy"] is True
        assert pool.inputs["compensateWithOnDemand"] is True
        limits = pool.inputs["spotPriceLimits"]
        assert {li["instanceType"] for li in limits} == set(pool.inputs["instanceTypes"])
        for li in limits:
            assert 0 < float(li["priceLimit"]) <= _cap(cfg, li["instanceType"]) + 1e-9
            checked += 1
        assert pool.inputs["scalingConfig"]["enable"] is True
    assert checked >= 1


def test_nodes_imdsv2_and_encrypted_disks(k):
    run, cfg = k
    checked = 0
    if cfg["cloud"] == "aws":
        templates = {
            f"{lt.name}-id": lt for lt in run.of_type("aws:ec2/launchTemplate:LaunchTemplate")
        }
        for group in run.of_type(POOL_TYPE["aws"]):
            lt = templates[group.inputs["launchTemplate"]["id"]]
            meta = lt.inputs["metadataOptions"]
            assert meta["httpTokens"] == "required" and meta["httpPutResponseHopLimit"] == 1
            assert all(b["ebs"]["encrypted"] == "true" for b in lt.inputs["blockDeviceMappings"])
            checked += 1
    else:
        for pool in run.of_type(POOL_TYPE["alicloud"]):
            assert pool.inputs["instanceMetadataOptions"]["httpTokens"] == "required"
            assert pool.inputs["systemDiskEncrypted"] is True
            checked += 1
    assert checked >= 2  # the system pool and at least one GPU pool


def test_cluster_encrypts_secrets_logs_and_limits_its_endpoint(k):
    run, cfg = k
    (cluster,) = run.of_type(CLUSTER_TYPE[cfg["cloud"]])
    i = cluster.inputs
    if cfg["cloud"] == "aws":
        assert i["encryptionConfig"]["resources"] == ["secrets"]
        assert i["encryptionConfig"]["provider"]["keyArn"]
        assert set(i["enabledClusterLogTypes"]) == {
            "api",
            "audit",
            "authenticator",
            "controllerManager",
            "scheduler",
        }
        vpc = i["vpcConfig"]
        assert vpc["endpointPrivateAccess"] is True
        assert vpc["publicAccessCidrs"] == cfg["admin_cidrs"]
        assert i["upgradePolicy"]["supportType"] == "STANDARD"
        (key,) = run.of_type("aws:kms/key:Key")
        assert key.inputs["enableKeyRotation"] is True
    else:
        assert i["encryptionProviderKey"] and i["clusterSpec"] == "ack.pro.small"
        assert i["slbInternetEnabled"] is False
        assert i["controlPlaneLogComponents"] and i["auditLogConfig"]["enabled"] is True
        assert i["deletionProtection"] is (cfg["env"] == "prod")


def test_least_privilege_roles(k8s_runs):
    run, _ = k8s_runs["aws-k8s"]
    attached = {
        a.inputs["policyArn"].rsplit("/", 1)[1]
        for a in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert attached == {
        "AmazonEKSClusterPolicy",
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
        "AmazonEC2ContainerRegistryPullOnly",
    }  # no Session Manager without access.ssm: true (infra/grants.py)
    checked = 0
    for policy in run.of_type("aws:iam/rolePolicy:RolePolicy"):
        for st in json.loads(policy.inputs["policy"])["Statement"]:
            assert not [a for a in st["Action"] if a == "*" or a.endswith(":*")]
            if "*" in st["Resource"]:
                # only calls IAM cannot scope, or scoped by a condition on the resource's tags
                verbs = {a.split(":")[1] for a in st["Action"]}
                assert st.get("Condition") or all(v.startswith(("Describe", "Get")) for v in verbs)
            checked += 1
    roles = {
        r.name: json.loads(r.inputs["assumeRolePolicy"]) for r in run.of_type("aws:iam/role:Role")
    }
    subjects = {
        name: next(iter(doc["Statement"][0]["Condition"]["StringEquals"].values()))
        for name, doc in roles.items()
        if "Condition" in doc["Statement"][0]
    }
    assert subjects == {
        "cluster-autoscaler": "system:serviceaccount:kube-system:cluster-autoscaler",
        "cluster-model-reader": "system:serviceaccount:kube-system:s3-csi-driver-sa",
    }
    assert checked >= 4


# -- cost and teardown --------------------------------------------------------------------------


def test_dev_clusters_scale_gpu_pools_to_zero_outside_hours_and_at_the_ttl(k):
    run, cfg = k
    aws = cfg["cloud"] == "aws"
    kind = (
        "aws:autoscaling/schedule:Schedule" if aws else "alicloud:ess/scheduledTask:ScheduledTask"
    )
    tasks = run.of_type(kind)
    if cfg["env"] == "prod":
        assert tasks == [] and run.outputs["ttl_expiry"] is None
        return
    groups = {
        r.name.removeprefix("cluster-"): r
        for r in run.of_type(POOL_TYPE[cfg["cloud"]])
        if "gpu" in r.name
    }
    checked = 0
    for pool, group in groups.items():
        mine = {
            t.name.rsplit("-", 1)[1]: t.inputs
            for t in tasks
            if t.name.startswith(f"teardown-{pool}-")
        }
        assert set(mine) == {"start", "stop", "ttl"}, (pool, sorted(mine))
        target = "autoscalingGroupName" if aws else "scalingGroupId"
        expected = f"eks-{group.name}-asg" if aws else f"asg-{group.name}"
        assert {t[target] for t in mine.values()} == {expected}
        low, high, desired = (
            ("minSize", "maxSize", "desiredCapacity")
            if aws
            else ("minValue", "maxValue", "desiredCapacity")
        )
        for action in ("stop", "ttl"):
            assert mine[action][low] == mine[action][high] == mine[action][desired] == 0
        if aws:
            scaling = group.inputs["scalingConfig"]
            assert (mine["start"][low], mine["start"][high]) == (
                scaling["minSize"],
                scaling["maxSize"],
            )
            assert mine["ttl"]["startTime"] == run.outputs["ttl_expiry"]
        else:
            assert mine["start"][high] == cfg["nodes"]["max"]
        checked += 1
    assert checked >= 1


def test_plan_shows_the_clusters_fixed_cost(k):
    run, cfg = k
    c = run.outputs["cluster_cost"]
    plane = {"aws": 0.10, "alicloud": 0.09}[cfg["cloud"]]
    assert c["control_plane_per_hour"] == plane
    system = cfg["kubernetes"].get("system", {}).get("count", 1)
    assert c["system_nodes"] == system
    assert c["fixed_per_hour"] == pytest.approx(plane + c["system_per_hour"])
    assert c["monthly_fixed"] == pytest.approx(c["fixed_per_hour"] * 730, abs=0.01)
    assert c["monthly_fixed"] < c["monthly_min"] <= c["monthly_max"]
    assert (
        c["gpu_max_per_hour"]
        <= cfg["nodes"]["max"] * _cap(cfg, cfg["instance_type"])
        + 1e-9
        + cfg["nodes"]["max"] * lookup(cfg["cloud"], cfg["instance_type"]).usd_per_hour
    )
    assert "2026" in c["price_source"]
    if cfg.get("schedule"):
        assert c["gpu_hours_per_month"] < 730
    if cfg["cloud"] == "aws":  # the budget covers the cluster, not only the GPU nodes
        (budget,) = run.of_type("aws:budgets/budget:Budget")
        if cfg["budget"]["monthly_usd"] == "auto":
            assert float(budget.inputs["limitAmount"]) >= c["monthly_max"]
    # the whole bill lists the same fixed part, the service's load balancer beside it, and it
    # all keeps billing after the TTL
    lines = {line["item"]: line for line in run.outputs["cost"]["lines"]}
    assert lines["cluster control plane"]["per_hour"] == plane
    assert lines["system nodes"]["per_hour"] == pytest.approx(c["system_per_hour"])
    assert "load balancer (the service's)" in lines
    if cfg.get("ttl_hours"):
        cost = run.outputs["cost"]
        fixed = sum(line["per_hour"] for line in lines.values() if line["after_ttl"])
        assert fixed > c["fixed_per_hour"] and cost["after_ttl_per_day"] == pytest.approx(
            fixed * 24, abs=0.01
        )


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", KUBERNETES_STACKS)
def test_bad_config_registers_nothing(stack, with_overrides):
    monitor = RecordingMonitor(OfflineMocks())
    block = dict(with_overrides(stack)["torchfleet:kubernetes"], image="runtime:latest")
    with pytest.raises(ConfigError, match="kubernetes.image"):
        run_offline(stack, with_overrides(stack, kubernetes=block), monitor=monitor)
    assert [t for _, t, *_ in monitor.registrations if not t.startswith("pulumi:")] == []


def _problems(with_overrides, stack: str, **overrides) -> str:
    from infra.config import load, raw_from_pulumi_config

    with pytest.raises(ConfigError) as err:
        load(raw_from_pulumi_config(with_overrides(stack, **overrides)), stack)
    return str(err.value)


def test_config_errors_name_the_key(with_overrides):
    block = with_overrides("aws-k8s")["torchfleet:kubernetes"]
    msg = _problems(with_overrides, "aws-k8s", kubernetes=None)
    assert "torchfleet:kubernetes = None" in msg and "image" in msg
    msg = _problems(
        with_overrides, "aws-k8s", kubernetes={**block, "image": None, "version": "1.29"}
    )
    assert "torchfleet:kubernetes.image" in msg and "torchfleet:kubernetes.version = '1.29'" in msg
    msg = _problems(with_overrides, "aws-k8s", kubernetes={**block, "replicas": {"max": 9}})
    assert "torchfleet:kubernetes.replicas" in msg and "<= 4" in msg
    msg = _problems(with_overrides, "aws-k8s", kubernetes={**block, "gpu_utilization_target": 100})
    assert "torchfleet:kubernetes.gpu_utilization_target = 100" in msg and "10..95" in msg
    msg = _problems(
        with_overrides, "aws-prod", scaling={"requests_per_node": 600, "gpu_utilization_percent": 5}
    )
    assert "torchfleet:scaling.gpu_utilization_percent = 5" in msg and "10..95" in msg
    msg = _problems(with_overrides, "aws-k8s", zones=["eu-central-1a"])
    assert "torchfleet:zones" in msg and "2 zones in mode: kubernetes" in msg
    msg = _problems(with_overrides, "aws-k8s", spot={"enabled": True, "max_price_ratio": 0.9})
    assert "torchfleet:spot.max_price_ratio = 0.9" in msg and "managed node groups" in msg
    msg = _problems(
        with_overrides,
        "aws-k8s",
        kubernetes={
            **block,
            "charts": {"keda": {"version": "2.0.0"}, "device_plugin": {"version": "latest"}},
        },
    )
    assert "torchfleet:kubernetes.charts.keda" in msg
    assert "torchfleet:kubernetes.charts.device_plugin.version = 'latest'" in msg
    msg = _problems(with_overrides, "aws-dev", kubernetes=block)
    assert "unset unless mode: kubernetes" in msg
    msg = _problems(
        with_overrides,
        "alicloud-k8s",
        kubernetes={**block, "charts": {"device_plugin": {"version": "0.20.0"}}},
    )
    assert "charts alicloud installs: prometheus, prometheus_adapter" in msg


def test_one_deploy_exports_each_clouds_cluster_the_same_way(k):
    """infra.k8s.component.deploy_kubernetes over either cloud's cluster (its Cluster protocol):
    the same outputs, the cluster's own facts (EKS: its endpoint; ACK: its id) beside the
    shared spot caps and currency, and the app registered after every node pool."""
    run, cfg = k
    assert {"cluster", "kubeconfig", "cluster_cost", "api_token"} <= set(run.outputs)
    cluster = run.outputs["cluster"]
    own = {"aws": {"name", "version", "endpoint"}, "alicloud": {"name", "version", "id"}}
    assert set(cluster) == own[cfg["cloud"]] | {"spot_caps_per_hour", "currency"}
    assert cluster["currency"] == run.outputs["cluster_cost"]["currency"]
    pools = {r.urn for r in run.of_type(POOL_TYPE[cfg["cloud"]])}
    assert len(pools) >= 2  # the system pool and at least one GPU pool
    (app,) = run.of_type("torchfleet:k8s:App")
    assert pools <= set(app.dependencies)
