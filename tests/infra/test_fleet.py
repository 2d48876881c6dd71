"""Policies of the self-configuring fleet (issue 8) over every registered resource of the example
stacks and of the bake / warm pool variants: user-data with the bundle checksum on every launch
spec, hooks and load-based policies on every group, a private, encrypted, versioned, TLS-only
bundle bucket, a node grant scoped to the bundle prefix, and a roll when the bundle changes.

Each test counts what it checked and fails when it checked nothing."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from infra.lifecycle import (
    GPU_TARGET_DEFAULT,
    HEALTH_GRACE_S,
    LAUNCH_TIMEOUT_DEFAULT_S,
    drain_timeout_s,
)
from infra.offline import FAKE_BAKED_AMI, _octet, run_offline

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
ESS = "alicloud:ess/scalingGroup:ScalingGroup"
ESS_CONFIG = "alicloud:ess/scalingConfiguration:ScalingConfiguration"
GROUPS = ("aws-prod", "alicloud-prod")
INSTANCES = ("aws-dev", "alicloud-dev")
ALI_INSTANCE = "alicloud:ecs/instance:Instance"


def cloud_config(encoded: str) -> tuple[str, dict]:
    """The user-data as the node's cloud-init reads it: base64 -> '#cloud-config' YAML."""
    text = base64.b64decode(encoded, validate=True).decode()
    assert text.startswith("#cloud-config\n"), text[:80]
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict) and doc, "an empty cloud-config configures nothing"
    assert len(text.encode()) <= 16 * 1024  # the EC2 user-data limit
    return text, doc


def launch_specs(run):
    """(resource, base64 user-data) of everything that starts a node."""
    templates = {f"{lt.name}-id": lt for lt in run.of_type(LT)}
    for lt in templates.values():
        yield lt, lt.inputs.get("userData")
    for inst in run.tagged("aws:ec2/instance:Instance", "gpu-node"):
        # the template's user-data, and the instance's own copy of it (a new bundle replaces
        # the instance, see test_instances_are_replaced_on_a_new_bundle)
        template = templates.get(inst.inputs.get("launchTemplate", {}).get("id"))
        assert template is not None, inst.name
        assert inst.inputs["userDataBase64"] == template.inputs["userData"], inst.name
        yield inst, inst.inputs["userDataBase64"]
    for r in run.tagged("alicloud:ecs/instance:Instance", "gpu-node") + run.of_type(ESS_CONFIG):
        yield r, r.inputs.get("userData")
    for recipe in run.of_type("aws:imagebuilder/imageRecipe:ImageRecipe"):
        yield recipe, recipe.inputs.get("userDataBase64")


def group_of_template(run) -> dict[str, str]:
    """Launch template id -> the name of the AWS group that launches from it."""
    out = {}
    for group in run.of_type(ASG):
        mixed = group.inputs.get("mixedInstancesPolicy")
        spec = (
            mixed["launchTemplate"]["launchTemplateSpecification"]["launchTemplateId"]
            if mixed
            else group.inputs["launchTemplate"]["id"]
        )
        out[spec] = group.inputs["name"]
    return out


def test_every_launch_spec_bootstraps_the_stack_bundle(run):
    sha = run.outputs["bundle_sha256"]
    owners = group_of_template(run)
    checked = 0
    for resource, encoded in launch_specs(run):
        assert encoded, f"{resource.type} {resource.name} starts nodes without user-data"
        text, _ = cloud_config(encoded)
        assert sha in text, f"{resource.name}: the user-data does not carry the bundle sha256"
        assert f"bundles/{run.stack}/{sha}.tar.gz" in text
        if run.stack in GROUPS:
            # each node completes the hooks of the group that launched it (the on-demand
            # fallback group's nodes name that group: infra.aws.fallback)
            group = owners.get(f"{resource.name}-id", f"torchfleet-{run.stack}-ess")
            for name in (group, "torchfleet-launch", "torchfleet-terminate"):
                assert name in text, f"{resource.name}: the node cannot name {name}"
        checked += 1
    nodes = len(
        run.tagged("aws:ec2/instance:Instance", "gpu-node")
        + run.tagged("alicloud:ecs/instance:Instance", "gpu-node")
    )
    templates = len(run.of_type(LT) + run.of_type(ESS_CONFIG))
    assert checked == nodes + templates >= 1, checked


def test_bundle_outputs(run):
    sha = run.outputs["bundle_sha256"]
    assert len(sha) == 64 and int(sha, 16) >= 0
    scheme = "s3" if run.stack.startswith("aws") else "oss"
    assert run.outputs["bundle_url"].startswith(f"{scheme}://")
    assert run.outputs["bundle_url"].endswith(f"/bundles/{run.stack}/{sha}.tar.gz")
    assert sha[:12] in run.outputs["bundle_version"]


def _by_bucket(run, type_: str) -> dict[str, dict]:
    return {r.inputs["bucket"]: r.inputs for r in run.of_type(type_)}


def test_bundle_bucket_private_encrypted_versioned_tls_only(run):
    checked = 0
    for _ in run.of_type("aws:s3/bucket:Bucket"):
        name = run.outputs["bundle_url"].split("/")[2]  # the bucket's name is its id
        block = _by_bucket(run, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")[name]
        assert all(
            block[k] is True
            for k in (
                "blockPublicAcls",
                "blockPublicPolicy",
                "ignorePublicAcls",
                "restrictPublicBuckets",
            )
        )
        sse = _by_bucket(
            run,
            "aws:s3/bucketServerSideEncryptionConfiguration:"
            "BucketServerSideEncryptionConfiguration",
        )[name]
        assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in (
            "AES256",
            "aws:kms",
        )
        versioning = _by_bucket(run, "aws:s3/bucketVersioning:BucketVersioning")[name]
        assert versioning["versioningConfiguration"]["status"] == "Enabled"
        ownership = _by_bucket(run, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")
        assert ownership[name]["rule"]["objectOwnership"] == "BucketOwnerEnforced"
        (deny,) = json.loads(_by_bucket(run, "aws:s3/bucketPolicy:BucketPolicy")[name]["policy"])[
            "Statement"
        ]
        assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        arn = f"arn:aws:s3:::{name}"
        assert sorted(deny["Resource"]) == [arn, f"{arn}/*"]
        (obj,) = run.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
        assert (
            obj.inputs["bucket"] == name
            and obj.inputs["key"] == run.outputs["bundle_url"].split(f"{name}/", 1)[1]
        )
        checked += 1
    for _ in run.of_type("alicloud:oss/bucket:Bucket"):
        name = run.outputs["bundle_url"].split("/")[2]
        assert _by_bucket(run, "alicloud:oss/bucketAcl:BucketAcl")[name]["acl"] == "private"
        assert (
            _by_bucket(run, "alicloud:oss/bucketPublicAccessBlock:BucketPublicAccessBlock")[name][
                "blockPublicAccess"
            ]
            is True
        )
        assert _by_bucket(
            run, "alicloud:oss/bucketServerSideEncryption:BucketServerSideEncryption"
        )[name]["sseAlgorithm"] in ("AES256", "KMS")
        assert (
            _by_bucket(run, "alicloud:oss/bucketVersioning:BucketVersioning")[name]["status"]
            == "Enabled"
        )
        tls = _by_bucket(run, "alicloud:oss/bucketHttpsConfig:BucketHttpsConfig")[name]
        assert tls["enable"] is True and set(tls["tlsVersions"]) <= {"TLSv1.2", "TLSv1.3"}
        (deny,) = json.loads(
            _by_bucket(run, "alicloud:oss/bucketPolicy:BucketPolicy")[name]["policy"]
        )["Statement"]
        assert deny["Effect"] == "Deny" and deny["Principal"] == ["*"]
        assert deny["Condition"] == {"Bool": {"acs:SecureTransport": ["false"]}}
        assert sorted(deny["Resource"]) == [f"acs:oss:*:*:{name}", f"acs:oss:*:*:{name}/*"]
        (obj,) = run.of_type("alicloud:oss/bucketObject:BucketObject")
        assert obj.inputs["bucket"] == name and obj.inputs["serverSideEncryption"] == "AES256"
        checked += 1
    assert checked == 1


def _statements(doc: str) -> list[dict]:
    return json.loads(doc)["Statement"]


def test_node_reads_only_its_bundle_prefix(run):
    bucket = run.outputs["bundle_url"].split("/")[2]
    prefix = f"bundles/{run.stack}/*"
    grants = []  # every statement that touches the bundle bucket
    if run.stack.startswith("aws"):
        docs = [p.inputs["policy"] for p in run.of_type("aws:iam/rolePolicy:RolePolicy")]
        resource = f"arn:aws:s3:::{bucket}/{prefix}"
    else:
        docs = [p.inputs["policyDocument"] for p in run.of_type("alicloud:ram/policy:Policy")]
        resource = f"acs:oss:*:*:{bucket}/{prefix}"
    for doc in docs:
        for statement in _statements(doc):
            resources = statement["Resource"]
            resources = [resources] if isinstance(resources, str) else resources
            if any(bucket in r for r in resources):
                grants.append(statement)
    assert grants, "the node role has no read grant on the bundle"
    for statement in grants:
        assert statement["Effect"] == "Allow"
        assert statement["Action"] in (["s3:GetObject"], ["oss:GetObject"]), statement
        assert statement["Resource"] == [resource], statement


@pytest.mark.parametrize("stack", GROUPS)
def test_groups_join_when_ready_and_leave_when_drained(runs, settings, stack):
    run, cfg = runs[stack], settings(stack)
    drain = drain_timeout_s(stack)
    if stack.startswith("aws"):
        kinds = {
            "autoscaling:EC2_INSTANCE_LAUNCHING": "ABANDON",
            "autoscaling:EC2_INSTANCE_TERMINATING": "CONTINUE",
        }
        all_hooks = run.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")
        # the spot group and its on-demand fallback group (infra.aws.fallback)
        groups = run.of_type(ASG)
        assert len(groups) == 2
        for group in groups:
            # the same hooks are on the group before its first node launches
            initial = {h["lifecycleTransition"]: h for h in group.inputs["initialLifecycleHooks"]}
            assert set(initial) == set(kinds)
            hooks = [
                h for h in all_hooks if h.inputs["autoscalingGroupName"] == group.inputs["name"]
            ]
            assert len(hooks) == len(kinds), group.name
            assert group.inputs["healthCheckType"] == "ELB"
            assert group.inputs["healthCheckGracePeriod"] == HEALTH_GRACE_S
    else:
        groups = run.of_type(ESS)
        assert len(groups) == 1
        kinds = {"SCALE_OUT": "ABANDON", "SCALE_IN": "CONTINUE"}
        hooks = run.of_type("alicloud:ess/lifecycleHook:LifecycleHook")
        (group,) = groups
        assert {h.inputs["scalingGroupId"] for h in hooks} == {f"{group.name}-id"}
        # a node failing /readyz behind the CLB is replaced
        assert group.inputs["healthCheckTypes"] == ["LOAD_BALANCER"]
        # the configuration that enables the group waits for the hooks
        (config,) = run.of_type(ESS_CONFIG)
        assert {h.urn for h in hooks} <= set(config.dependencies)
    by_kind = {h.inputs["lifecycleTransition"]: h.inputs for h in hooks}
    assert set(by_kind) == set(kinds)
    for kind, result in kinds.items():
        assert by_kind[kind]["defaultResult"] == result
    launch, terminate = (by_kind[k] for k in kinds)
    timeout = (cfg.get("scaling") or {}).get("launch_timeout_s", LAUNCH_TIMEOUT_DEFAULT_S)
    assert launch["heartbeatTimeout"] == timeout and launch["name"] == "torchfleet-launch"
    # docs/contracts/node.md: at least drain + systemd's 15 s + the watcher's poll and call
    assert terminate["heartbeatTimeout"] >= drain + 15 + 15
    assert terminate["name"] == "torchfleet-terminate"


def test_every_group_scales_on_load(runs, settings, with_overrides):
    checked = 0
    for stack in GROUPS:
        run = runs[stack]
        requests = run.of_type("aws:autoscaling/policy:Policy")
        for group in run.of_type(ASG):
            if group.inputs["name"].endswith("-od-asg"):
                continue  # the on-demand fallback is sized by its alarms (test_fallback.py)
            mine = [p for p in requests if p.inputs["autoscalingGroupName"] == group.inputs["name"]]
            metrics = {}
            for policy in mine:
                assert policy.inputs["policyType"] == "TargetTrackingScaling"
                tt = policy.inputs["targetTrackingConfiguration"]
                assert tt["targetValue"] > 0 and not tt.get("disableScaleIn")
                if "predefinedMetricSpecification" in tt:
                    spec = tt["predefinedMetricSpecification"]
                    metrics[spec["predefinedMetricType"]] = spec
                else:
                    spec = tt["customizedMetricSpecification"]
                    metrics[spec["metricName"]] = spec
            # <ALB arn suffix>/<target group arn suffix>, as the offline mocks make them
            (alb,) = run.of_type("aws:lb/loadBalancer:LoadBalancer")
            (tg,) = run.of_type("aws:lb/targetGroup:TargetGroup")
            assert metrics["ALBRequestCountPerTarget"]["resourceLabel"] == (
                f"app/{alb.name}/{_octet(alb.name):016x}/"
                f"targetgroup/{tg.name}/{_octet(tg.name):016x}"
            )
            for name, unit in (("QueueDepth", "Count"), ("GpuUtilization", "Percent")):
                custom = metrics[name]  # what the node agent publishes, by group
                assert custom["namespace"] == "torchfleet" and custom["statistic"] == "Minimum"
                assert custom["unit"] == unit
                assert custom["metricDimensions"] == [
                    {"name": "AutoScalingGroupName", "value": group.inputs["name"]}
                ]
            gpu = next(
                p.inputs["targetTrackingConfiguration"]["targetValue"]
                for p in mine
                if p.inputs["name"].endswith("-gpu-utilization")
            )
            want = (settings(stack).get("scaling") or {}).get("gpu_utilization_percent")
            assert gpu == (want or GPU_TARGET_DEFAULT)
            checked += 1
        rules = {f"{r.name}-id": r for r in run.of_type("alicloud:ess/scalingRule:ScalingRule")}
        (monitor,) = run.of_type("alicloud:cms/monitorGroup:MonitorGroup") or [None]
        for group in run.of_type(ESS):
            alarms = [
                a.inputs
                for a in run.of_type("alicloud:ess/alarm:Alarm")
                if a.inputs["scalingGroupId"] == f"{group.name}-id"
            ]
            signals = {}
            for alarm in alarms:
                assert alarm["metricType"] == "custom"
                # the application group the node agent publishes to (numeric id)
                assert alarm["cloudMonitorGroupId"] == 1000 + _octet(monitor.name)
                (action,) = alarm["alarmActions"]
                rule = next(r for rid, r in rules.items() if action.endswith(rid))
                assert rule.inputs["scalingRuleType"] == "StepScalingRule"
                step = sum(a["scalingAdjustment"] for a in rule.inputs["stepAdjustments"])
                names = [e["metricName"] for e in alarm.get("expressions", [])] or [
                    alarm["metricName"]
                ]
                signals.setdefault("out" if step > 0 else "in", set()).update(names)
            assert signals["out"] == {"QueueDepth", "RequestRate", "GpuUtilization"}
            assert signals["in"] == {"QueueDepth", "RequestRate", "GpuUtilization"}  # all agree
            checked += 1
    assert checked == 2
    # scale_in: false keeps every policy from removing nodes
    run = run_offline(
        "aws-prod",
        with_overrides("aws-prod", scaling={"requests_per_node": 600, "scale_in": False}),
    )
    tracking = [
        p
        for p in run.of_type("aws:autoscaling/policy:Policy")
        if p.inputs["policyType"] == "TargetTrackingScaling"
    ]
    # requests, queue depth and GPU utilisation (the fallback group's step policies only
    # ever follow the spot group's shortfall: infra/aws/fallback.py)
    assert len(tracking) == 3
    assert all(p.inputs["targetTrackingConfiguration"]["disableScaleIn"] is True for p in tracking)
    run = run_offline(
        "alicloud-prod",
        with_overrides("alicloud-prod", scaling={"requests_per_node": 600, "scale_in": False}),
    )
    assert len(run.of_type("alicloud:ess/alarm:Alarm")) == 3  # the three scale-out alarms


@pytest.mark.parametrize("stack", GROUPS)
def test_the_gpu_target_comes_from_the_config(with_overrides, stack):
    scaling = {"requests_per_node": 600, "gpu_utilization_percent": 55}
    run = run_offline(stack, with_overrides(stack, scaling=scaling))
    targets = [
        p.inputs["targetTrackingConfiguration"]["targetValue"]
        for p in run.of_type("aws:autoscaling/policy:Policy")
        if p.inputs.get("targetTrackingConfiguration", {})
        .get("customizedMetricSpecification", {})
        .get("metricName")
        == "GpuUtilization"
    ]
    alarms = run.of_type("alicloud:ess/alarm:Alarm")
    targets += [
        float(a.inputs["threshold"])
        for a in alarms
        if a.inputs.get("metricName") == "GpuUtilization"
    ]
    # scale in below the hysteresis share of the target, as for every other signal
    (low,) = [a for a in alarms if a.inputs.get("expressions")] or [None]
    if low is not None:
        (gpu_in,) = [e for e in low.inputs["expressions"] if e["metricName"] == "GpuUtilization"]
        assert 0 < gpu_in["threshold"] < 55
    assert targets == [55]
    for rule in run.of_type("alicloud:ess/scalingRule:ScalingRule"):
        if "gpuutilization" in rule.name:
            # +2 nodes halfway from 55 % to 100 %: twice the target would be out of reach
            one, two = rule.inputs["stepAdjustments"]
            assert (
                float(one["metricIntervalUpperBound"])
                == 22.5
                == float(two["metricIntervalLowerBound"])
            )
            assert (one["scalingAdjustment"], two["scalingAdjustment"]) == (1, 2)


def test_a_new_bundle_rolls_the_fleet(runs, with_overrides, monkeypatch):
    """The group pins the template's latest version (a new version -> instance refresh); the
    ESS configuration is named by the bundle and replaced when its user-data changes; a plain
    instance is replaced (cloud-init configures a node once per instance)."""
    (asg,) = [g for g in runs["aws-prod"].of_type(ASG) if g.inputs["name"].endswith("prod-asg")]
    refresh = asg.inputs["instanceRefresh"]
    assert refresh["strategy"] == "Rolling"
    assert refresh["preferences"]["autoRollback"] is True
    spec = asg.inputs["mixedInstancesPolicy"]["launchTemplate"]["launchTemplateSpecification"]
    assert spec["version"] == "1"  # the mocked latestVersion, never "$Latest"
    (config,) = runs["alicloud-prod"].of_type(ESS_CONFIG)
    assert (
        runs["alicloud-prod"].outputs["bundle_sha256"][:12]
        in config.inputs["scalingConfigurationName"]
    )
    assert {"userData", "imageId"} <= set(config.replace_on_changes)
    assert config.inputs["active"] is True

    from infra import bundle, nodeboot

    real = bundle.build

    def other(stack, dest=None, **kwargs):  # the same stack after a change to a role
        made = real(stack, dest, **kwargs)
        sha = "f" * 64
        return type(made)(
            path=made.path,
            sha256=sha,
            key=f"bundles/{stack}/{sha}.tar.gz",
            version=f"changed-{sha[:12]}",
        )

    nodeboot.clear_bundle_cache()
    monkeypatch.setattr(bundle, "build", other)
    try:
        changed = {s: run_offline(s, with_overrides(s)) for s in (*GROUPS, *INSTANCES)}
    finally:
        nodeboot.clear_bundle_cache()
    before = runs["aws-prod"].of_type(LT)[0].inputs["userData"]
    after = changed["aws-prod"].of_type(LT)[0].inputs["userData"]
    assert before != after and "f" * 64 in cloud_config(after)[0]
    (new_config,) = changed["alicloud-prod"].of_type(ESS_CONFIG)
    assert new_config.inputs["userData"] != config.inputs["userData"]
    assert (
        new_config.inputs["scalingConfigurationName"] != config.inputs["scalingConfigurationName"]
    )
    checked = 0
    for stack in INSTANCES:
        kind = "aws:ec2/instance:Instance" if stack.startswith("aws") else ALI_INSTANCE
        field = "userDataBase64" if stack.startswith("aws") else "userData"
        old_nodes, new_nodes = (r.tagged(kind, "gpu-node") for r in (runs[stack], changed[stack]))
        for old_node, new_node in zip(old_nodes, new_nodes, strict=True):
            assert old_node.inputs[field] != new_node.inputs[field], new_node.name
            assert "f" * 64 in cloud_config(new_node.inputs[field])[0]
            if stack.startswith("aws"):  # the provider replaces, not stop/start, on a change
                assert new_node.inputs["userDataReplaceOnChange"] is True
            else:  # ECS would apply it in place with a reboot
                assert "userData" in new_node.replace_on_changes
            checked += 1
    assert checked == 3  # aws-dev's node and alicloud-dev's two


def test_the_program_hands_the_bundle_its_validated_config(with_overrides, monkeypatch):
    """The bundle's node.json comes from the config Pulumi runs, not from the stack file read
    again (which may hold Pulumi secrets): the file is never opened here."""
    import tarfile

    from infra import bundle, nodeboot, stacks

    seen = []
    real = bundle.build

    def recording(stack, dest=None, **kwargs):
        seen.append(kwargs.get("config"))
        return real(stack, dest, **kwargs)

    def no_file(*_args, **_kwargs):
        raise AssertionError("the program read the stack file again")

    nodeboot.clear_bundle_cache()
    monkeypatch.setattr(bundle, "build", recording)
    monkeypatch.setattr(stacks, "load_stack_config", no_file)
    try:
        run = run_offline(
            "aws-prod",
            with_overrides("aws-prod", spot={"enabled": False}, extra_instance_types=None),
        )
    finally:
        nodeboot.clear_bundle_cache()
    assert len(seen) == 1 and seen[0] is not None and seen[0].spot.enabled is False
    key = run.outputs["bundle_url"].split("/", 3)[3]
    path = next(
        p for p in bundle.CACHE.glob("aws-prod/*.tar.gz") if bundle._sha256(p.read_bytes()) in key
    )
    with tarfile.open(path) as tar:
        facts = json.load(tar.extractfile("node.json"))
    assert facts["group_vars"]["torchfleet_spot"] is False  # the file says true


def test_nodes_start_only_once_the_bundle_and_grants_exist(run):
    deps_needed = {
        r.urn
        for r in run.custom()
        if r.type
        in ("aws:s3/bucketObjectv2:BucketObjectv2", "alicloud:oss/bucketObject:BucketObject")
    }
    assert len(deps_needed) == 1
    checked = 0
    for r in (
        run.of_type(ASG)
        + run.tagged("aws:ec2/instance:Instance", "gpu-node")
        + run.tagged("alicloud:ecs/instance:Instance", "gpu-node")
        + run.of_type(ESS_CONFIG)
    ):
        assert deps_needed <= set(r.dependencies), (r.type, r.name)
        checked += 1
    assert checked >= 1


def test_warm_pool_and_baked_image(with_overrides):
    """aws-prod on-demand with a warm pool and an image baked by Image Builder."""
    run = run_offline(
        "aws-prod",
        with_overrides(
            "aws-prod",
            spot={"enabled": False},
            extra_instance_types=None,
            boot="bake",
            warm_pool={"enabled": True, "min_size": 1},
        ),
    )
    (asg,) = run.of_type(ASG)
    warm = asg.inputs["warmPool"]
    assert warm["poolState"] == "Stopped" and warm["minSize"] == 1
    assert warm["instanceReusePolicy"]["reuseOnScaleIn"] is True
    # warm pools refuse mixed instances policies: one type, the template pinned directly
    assert (
        "mixedInstancesPolicy" not in asg.inputs and asg.inputs["launchTemplate"]["version"] == "1"
    )
    (lt,) = run.of_type(LT)
    assert lt.inputs["imageId"] == FAKE_BAKED_AMI  # the group launches the baked AMI
    text, _ = cloud_config(lt.inputs["userData"])
    assert "baked" in text  # the node only checks pins, fetches the model and warms up
    (recipe,) = run.of_type("aws:imagebuilder/imageRecipe:ImageRecipe")
    assert recipe.inputs["parentImage"] == "ami-0123456789abcdef0"
    assert run.outputs["bundle_sha256"][:12] in recipe.inputs["name"]
    bake_text, _ = cloud_config(recipe.inputs["userDataBase64"])
    assert run.outputs["bundle_sha256"] in bake_text and "bake" in bake_text
    assert recipe.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    (infra,) = run.of_type(
        "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"
    )
    assert infra.inputs["instanceMetadataOptions"]["httpTokens"] == "required"
    assert infra.inputs["terminateInstanceOnFailure"] is True
    (component,) = run.of_type("aws:imagebuilder/component:Component")
    doc = yaml.safe_load(component.inputs["data"])
    (step,) = doc["phases"][0]["steps"]
    assert step["action"] == "ExecuteBash" and "bootstrap.json" in step["inputs"]["commands"][0]
    assert run.of_type("aws:imagebuilder/image:Image")
    assert run.outputs["cost"]["warm_pool_per_month"] > 0


def test_hook_timeouts_come_from_the_measured_stages():
    from infra import lifecycle
    from infra.bootstrap.torchfleet_agent import lifecycle as agent
    from infra.config import LAUNCH_TIMEOUT_RANGE

    # the longest silence between two heartbeats: around a reboot (infra/lifecycle.py)
    silence = (
        2 * agent.HEARTBEAT_S + lifecycle.EC2_REBOOT_MAX_S + lifecycle.PRE_HEARTBEAT_STAGE_MAX_S
    )
    assert silence <= LAUNCH_TIMEOUT_DEFAULT_S < silence + 60
    assert LAUNCH_TIMEOUT_DEFAULT_S % 60 == 0
    assert LAUNCH_TIMEOUT_RANGE[0] <= LAUNCH_TIMEOUT_DEFAULT_S <= LAUNCH_TIMEOUT_RANGE[1]
    # terminate: drain + systemd's margin + the slower watcher poll (ESS, 15 s)
    assert lifecycle.terminate_timeout_s("aws-prod") == drain_timeout_s("aws-prod") + 15 + 15
    # a whole cold bootstrap is not a heartbeat gap: the first-capacity wait is its own budget
    assert lifecycle.COLD_BOOTSTRAP_BUDGET_S > LAUNCH_TIMEOUT_DEFAULT_S


def test_launch_estimates_are_measured_parts_plus_named_ones():
    from infra.lifecycle import LB_HEALTH_INTERVAL_S, LB_HEALTHY_THRESHOLD, estimates

    lb = LB_HEALTHY_THRESHOLD * LB_HEALTH_INTERVAL_S
    found = estimates()
    assert set(found) == {"cold", "cold_debian11", "baked", "warm_pool"}
    assert found["cold"].known_s == (98 + lb, 102 + lb)
    assert found["baked"].known_s == (36 + lb, 41 + lb)
    assert set(found["cold"].unmeasured) == {
        "launch",
        "gpu_driver",
        "cuda_toolkit",
        "torch_cuda_download",
        "gpu_warmup",
    }
    assert found["warm_pool"].unmeasured == ("start", "gpu_warmup")
    for estimate in found.values():
        assert [p for p in estimate.parts if p.seconds is not None], estimate.path
        assert "cloud/GPU only: " in estimate.summary()  # no total without its named parts
