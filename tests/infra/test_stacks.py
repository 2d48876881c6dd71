"""Each example stack under the mock engine: what it registers and what it exports."""

from __future__ import annotations

import pytest

from infra.catalog import lookup
from infra.offline import FAKE_ALI_IMAGE, FAKE_AMI, OfflineMocks, RecordingMonitor, run_offline
from infra.plan import STACKS

# Cloud resources each example must register at least once (the mode decides which).
BUNDLE = {
    "aws": {
        "aws:s3/bucket:Bucket",
        "aws:s3/bucketObjectv2:BucketObjectv2",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/bucketPolicy:BucketPolicy",
    },
    "alicloud": {
        "alicloud:oss/bucket:Bucket",
        "alicloud:oss/bucketObject:BucketObject",
        "alicloud:oss/bucketAcl:BucketAcl",
        "alicloud:oss/bucketPolicy:BucketPolicy",
    },
}
EXPECTED = {
    "aws-dev": {
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/routeTable:RouteTable",
        "aws:ec2/securityGroup:SecurityGroup",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:ec2/instance:Instance",
        "aws:iam/instanceProfile:InstanceProfile",
        "aws:scheduler/schedule:Schedule",
        "aws:budgets/budget:Budget",
    },
    "aws-prod": {
        "aws:autoscaling/group:Group",
        "aws:lb/loadBalancer:LoadBalancer",
        "aws:lb/targetGroup:TargetGroup",
        "aws:lb/listener:Listener",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:budgets/budget:Budget",
        "aws:autoscaling/lifecycleHook:LifecycleHook",
        "aws:autoscaling/policy:Policy",
    },
    "alicloud-dev": {
        "alicloud:vpc/network:Network",
        "alicloud:vpc/switch:Switch",
        "alicloud:ecs/securityGroupRule:SecurityGroupRule",
        "alicloud:ecs/instance:Instance",
        "alicloud:ram/role:Role",
        "alicloud:oos/execution:Execution",
    },
    "alicloud-prod": {
        "alicloud:ess/scalingGroup:ScalingGroup",
        "alicloud:ess/scalingConfiguration:ScalingConfiguration",
        "alicloud:slb/applicationLoadBalancer:ApplicationLoadBalancer",
        "alicloud:slb/listener:Listener",
        "alicloud:ess/lifecycleHook:LifecycleHook",
        "alicloud:ess/scalingRule:ScalingRule",
        "alicloud:ess/alarm:Alarm",
        "alicloud:cms/monitorGroup:MonitorGroup",
    },
}


def test_registers_a_real_fleet(run, settings):
    custom = run.custom()
    assert len(custom) >= 14, f"{run.stack}: only {len(custom)} cloud resources"
    expected = EXPECTED[run.stack] | BUNDLE[run.stack.split("-")[0]]
    missing = expected - {r.type for r in custom}
    assert not missing, f"{run.stack} registered no {sorted(missing)}"
    # one component per concept
    components = {
        r.type.rsplit(":", 1)[1] for r in run.resources if r.type.startswith("torchfleet:")
    }
    monitored = "monitoring" in settings(run.stack)
    assert components == {"Network", "Bundle", "Fleet", "Teardown"} | (
        {"Monitoring"} if monitored else set()
    )


def test_every_cloud_resource_sits_in_a_component(run):
    parents = {r.urn: r.type for r in run.resources}
    for r in run.custom():
        assert parents.get(r.parent, "").startswith("torchfleet:"), (r.type, r.name)


def test_image_auto_resolved_through_an_invoke(run, settings):
    images = [
        c for c in run.calls if c in ("aws:ec2/getAmi:getAmi", "alicloud:ecs/getImages:getImages")
    ]
    # the nodes' image, and the monitoring host's Debian 12 where there is one
    assert len(images) == 1 + ("monitoring" in settings(run.stack))
    # AWS also asks who it is: the node's lifecycle grant names the account's group ARN
    assert sorted(set(run.calls) - set(images)) == (
        ["aws:index/getCallerIdentity:getCallerIdentity"] if run.stack.startswith("aws") else []
    )
    image = FAKE_AMI if run.stack.startswith("aws") else FAKE_ALI_IMAGE
    users = [r for r in run.custom() if r.inputs.get("imageId")]
    assert users and all(r.inputs["imageId"] == image for r in users)


def test_inventory_output(run, settings):
    cfg = settings(run.stack)
    group = run.outputs["inventory"]["all"]["children"]["gpu_nodes"]
    if cfg["mode"] == "instances":
        hosts = group["hosts"]
        assert len(hosts) == cfg["nodes"]["count"]
        itype = lookup(cfg["cloud"], cfg["instance_type"]) if "instance_type" in cfg else None
        for name, host in hosts.items():
            assert name.startswith(run.stack)
            assert host["ansible_host"] == host["public_ip"] and host["private_ip"].startswith(
                "10.42."
            )
            assert host["torchfleet_cloud"] == cfg["cloud"]
            assert host["torchfleet_env"] == cfg["env"]
            assert host["torchfleet_cuda_profile"] == cfg["cuda_profile"]
            assert host["torchfleet_spot"] is cfg["spot"]["enabled"]
            if itype:
                assert host["torchfleet_instance_type"] == itype.name
                assert host["torchfleet_gpu_model"] == itype.gpu_model
            assert (
                host["torchfleet_compute_capability"]
                == lookup(cfg["cloud"], host["torchfleet_instance_type"]).compute_capability
            )
        assert run.outputs["endpoint"].endswith(f":{cfg['service_port']}")
        assert run.outputs["ssh_tunnel"].startswith("ssh -N -L")
    else:
        assert group["hosts"] == {}
        assert group["vars"]["torchfleet_cloud"] == cfg["cloud"]
        discovery = run.outputs["inventory"]["all"]["vars"]["torchfleet_discovery"]
        assert discovery == run.outputs["discovery"]
        assert run.stack in str(discovery)
        # HTTPS wherever a certificate is given (every example group stack has one)
        scheme = "https://" if cfg.get("tls") else "http://"
        assert run.outputs["endpoint"].startswith(scheme)


def test_cost_output(run, settings):
    cost = run.outputs["cost"]
    assert cost["nodes"] == cost["on_demand_nodes"] + cost["spot_nodes"] > 0
    assert cost["spot_cap_per_hour"] <= cost["on_demand_per_hour"] * 1.3
    assert cost["monthly_typical"] <= cost["monthly_worst_case"]
    # the scaling bounds: instances mode runs a fixed count
    assert (
        cost["spot_cap_per_hour_at_min"]
        <= cost["spot_cap_per_hour"]
        <= cost["spot_cap_per_hour_at_max"]
    )
    assert (
        cost["monthly_worst_at_min"] <= cost["monthly_worst_case"] <= cost["monthly_worst_at_max"]
    )
    nodes = settings(run.stack)["nodes"]
    if "max" in nodes:
        assert (cost["min_nodes"], cost["max_nodes"]) == (nodes["min"], nodes["max"])
        assert cost["spot_cap_per_hour_at_max"] > cost["spot_cap_per_hour_at_min"]
    else:
        assert cost["min_nodes"] == cost["max_nodes"] == nodes["count"]
    if settings(run.stack).get("schedule"):
        assert cost["hours_per_month"] < 730
        assert cost["monthly_worst_case"] < cost["monthly_on_demand_24x7"]


def test_ttl_output_only_in_dev(run, settings):
    expiry = run.outputs["ttl_expiry"]
    if run.stack.endswith("-dev"):
        hours = settings(run.stack)["ttl_hours"]
        # pinned clock 10:17 -> TTL counts from 11:00
        assert expiry == f"2026-03-02T{11 + hours:02d}:00:00Z"
    else:
        assert expiry is None


def test_gpu_by_model_resolves_cheapest_type(with_overrides):
    run = run_offline(
        "aws-dev",
        with_overrides(
            "aws-dev",
            gpu={"model": "A10G", "count": 1},
            cuda_profile="cu116",
            image_distro="debian-11",
        ),
    )
    assert (
        run.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0].inputs["instanceType"]
        == "g5.xlarge"
    )


def test_a_second_run_in_the_same_process_starts_clean(runs, with_overrides):
    again = run_offline("aws-dev", with_overrides("aws-dev"))
    # registration order is async; the set and the count must match exactly
    assert sorted(r.urn for r in again.resources) == sorted(
        r.urn for r in runs["aws-dev"].resources
    )


@pytest.mark.parametrize("stack", STACKS)
def test_bad_config_registers_nothing(stack, with_overrides):
    from infra.config import ConfigError

    monitor = RecordingMonitor(OfflineMocks())
    with pytest.raises(ConfigError, match="admin_cidrs"):
        run_offline(stack, with_overrides(stack, admin_cidrs=["0.0.0.0/0"]), monitor=monitor)
    registered = [t for _, t, *_ in monitor.registrations if not t.startswith("pulumi:")]
    assert registered == []
    # the same monitor sees resources when the config is good: the check above can fail
    run_offline(stack, with_overrides(stack), monitor=monitor)
    assert [t for _, t, *_ in monitor.registrations if not t.startswith("pulumi:")]


def test_too_many_zones_fail_before_any_resource(with_overrides):
    """The address plan has 16 blocks; a 17th zone used to crash after the VPC was registered."""
    from infra.config import ConfigError

    zones = [f"eu-central-1{chr(ord('a') + i)}" for i in range(17)]
    monitor = RecordingMonitor(OfflineMocks())
    with pytest.raises(ConfigError, match="torchfleet:zones"):
        run_offline("aws-dev", with_overrides("aws-dev", zones=zones), monitor=monitor)
    assert [t for _, t, *_ in monitor.registrations if not t.startswith("pulumi:")] == []
    # the same monitor registers the stack once the zones fit (test_config: sixteen load)
    run_offline("aws-dev", with_overrides("aws-dev", zones=zones[:2]), monitor=monitor)
    assert [t for _, t, *_ in monitor.registrations if t == "aws:ec2/subnet:Subnet"]
