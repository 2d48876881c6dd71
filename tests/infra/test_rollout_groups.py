"""A rollout on an AWS group stack in the program, under the mock engine over aws-prod: while
the `rollout` block gives the candidate a share and names its model (a content-addressed
`<sha256>.pt` in model_bucket), a candidate Auto Scaling group exists beside the stable one,
registered in the candidate target group only, sized by the split, its nodes' node config
carrying the candidate's model and checksum (and no secret); `stable_model` moves the stable
group's nodes the same way (a promotion); at weight 0, or without the block, no candidate group
and the stable group's node config has no model (the plan as before). And the block's
group-mode refusals name the key and the allowed values."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from infra import config
from infra.bootstrap.torchfleet_agent import boot
from infra.offline import run_offline

ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
CAND_SHA, STABLE_SHA = "c" * 64, "5" * 64
BUCKET = "example-torchfleet-models"  # Pulumi.aws-prod.yaml's model_bucket


def _node_config(template_inputs: dict) -> dict:
    """The node config (/etc/torchfleet/node.json) in a launch template's user-data."""
    doc = yaml.safe_load(base64.b64decode(template_inputs["userData"]).decode())
    (entry,) = [f for f in doc["write_files"] if f["path"] == boot.CONFIG]
    return json.loads(entry["content"])


def _groups(run) -> dict[str, dict]:
    return {g.inputs["name"]: g.inputs for g in run.of_type(ASG)}


def _template_of(run, group: dict) -> dict:
    templates = {f"{t.name}-id": t.inputs for t in run.of_type(LT)}
    spec = group["mixedInstancesPolicy"]["launchTemplate"]["launchTemplateSpecification"]
    return templates[spec["launchTemplateId"]]


def _target_name(arn: str) -> str:
    return arn.rsplit(":", 1)[-1].removesuffix("-id")  # the mock engine's ARNs (infra.offline)


def _run(with_overrides, **block):
    return run_offline("aws-prod", with_overrides("aws-prod", rollout=block))


def test_a_candidate_group_serves_the_candidate_model_in_the_candidate_target_group_only(
    with_overrides, settings
):
    run = _run(with_overrides, candidate_weight=10, candidate_model=f"{CAND_SHA}.pt")
    groups = _groups(run)
    stable, od = groups["torchfleet-aws-prod-asg"], groups["torchfleet-aws-prod-od-asg"]
    cand = groups["torchfleet-aws-prod-candidate-asg"]
    # registered in the candidate target group only; the stable groups keep theirs
    assert [_target_name(a) for a in cand["targetGroupArns"]] == ["fleet-tg-candidate"]
    assert stable["targetGroupArns"] == od["targetGroupArns"]
    assert [_target_name(a) for a in stable["targetGroupArns"]] == ["fleet-tg"]
    # aws-prod: nodes min 2, max 8. 10 % beside 2 stable nodes: one candidate node
    nodes = settings("aws-prod")["nodes"]
    assert (cand["minSize"], cand["maxSize"], cand["desiredCapacity"]) == (1, 1, 1)
    # the stable group's nodes: the same types, subnets, spot settings and hooks
    assert cand["vpcZoneIdentifiers"] == stable["vpcZoneIdentifiers"]
    mixed = lambda g: {  # noqa: E731
        "types": [
            o["instanceType"] for o in g["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
        ],
        "distribution": g["mixedInstancesPolicy"]["instancesDistribution"],
    }
    assert mixed(cand) == mixed(stable)
    hooks = lambda g: sorted(h["name"] for h in g["initialLifecycleHooks"])  # noqa: E731
    assert hooks(cand) == hooks(stable)
    assert cand["healthCheckType"] == "ELB"
    # its nodes' node config: the candidate's model and checksum, its own group and target group
    node = _node_config(_template_of(run, cand))
    assert node["model"] == {
        "source": f"s3://{BUCKET}/models/{CAND_SHA}.pt",
        "checksum": f"sha256:{CAND_SHA}",
    }
    assert node["group_name"] == "torchfleet-aws-prod-candidate-asg"
    assert _target_name(node["target_group_arn"]) == "fleet-tg-candidate"
    # no secret: the token's secret is named, never its value
    token = run.outputs["api_token"]
    assert token and token not in json.dumps(node)
    assert [k for k in node if "token" in k or "secret" in k] == ["api_token_secret"]
    # the stable groups' nodes keep the bundle's model (no stable_model in the block)
    for g in (stable, od):
        assert "model" not in _node_config(_template_of(run, g))
    # the candidate's nodes may complete their own group's lifecycle hooks and leave their group
    policies = [p.inputs["policy"] for p in run.of_type("aws:iam/rolePolicy:RolePolicy")]
    (hooks_grant,) = [json.loads(p) for p in policies if "CompleteLifecycleAction" in p]
    groups_granted = [r.rsplit("/", 1)[1] for r in hooks_grant["Statement"][0]["Resource"]]
    assert groups_granted == [
        "torchfleet-aws-prod-asg",
        "torchfleet-aws-prod-od-asg",
        "torchfleet-aws-prod-candidate-asg",
    ]
    leave = [json.loads(p) for p in policies if "DeregisterTargets" in p]
    assert sorted(_target_name(g["Statement"][0]["Resource"][0]) for g in leave) == [
        "fleet-tg",
        "fleet-tg-candidate",
    ]
    assert nodes["max"] - nodes["min"] == 6  # the cap the next test meets


@pytest.mark.parametrize(("weight", "size"), [(50, 2), (75, 6), (100, 6)])
def test_the_candidate_group_grows_with_the_weight_up_to_max_less_the_stable_minimum(
    with_overrides, weight, size
):
    run = _run(with_overrides, candidate_weight=weight, candidate_model=f"{CAND_SHA}.pt")
    cand = _groups(run)["torchfleet-aws-prod-candidate-asg"]
    assert (cand["minSize"], cand["maxSize"], cand["desiredCapacity"]) == (size, size, size)


def test_without_a_share_or_a_model_there_is_no_candidate_group(with_overrides, runs):
    before = runs["aws-prod"]
    for block in (
        {"candidate_weight": 0, "candidate_model": f"{CAND_SHA}.pt"},  # rolled back / promoted
        {"sticky_s": 60},  # the block alone: the candidate target group without traffic
    ):
        run = _run(with_overrides, **block)
        assert (
            set(_groups(run))
            == set(_groups(before))
            == {"torchfleet-aws-prod-asg", "torchfleet-aws-prod-od-asg"}
        )
        assert not [
            r for r in run.resources if "candidate-asg" in r.name or "candidate-lt" in r.name
        ]
    # without the block: no model in any node config, the user-data byte for byte as before
    assert all(
        "model" not in _node_config(_template_of(before, g)) for g in _groups(before).values()
    )


def test_stable_model_moves_the_stable_groups_nodes(with_overrides, runs):
    """The promotion: the stable group (and its on-demand fallback) on the candidate's file, a
    new launch template version, so the group's instance refresh rolls it."""
    run = _run(with_overrides, candidate_weight=0, stable_model=f"{STABLE_SHA}.pt")
    before = _groups(runs["aws-prod"])
    for name, g in _groups(run).items():
        node = _node_config(_template_of(run, g))
        assert node["model"] == {
            "source": f"s3://{BUCKET}/models/{STABLE_SHA}.pt",
            "checksum": f"sha256:{STABLE_SHA}",
        }
        assert (
            _template_of(run, g)["userData"]
            != _template_of(runs["aws-prod"], before[name])["userData"]
        )
        assert g["instanceRefresh"]["strategy"] == "Rolling"


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        ({"rollout": {"candidate_model": "v2.pt"}}, "rollout.candidate_model", "<sha256"),
        ({"rollout": {"stable_model": "model.pt"}}, "rollout.stable_model", "64 lowercase hex"),
        (
            {"rollout": {"candidate_weight": 10}},  # a share for a target group without nodes
            "rollout.candidate_model",
            "set while candidate_weight is above 0",
        ),
        (
            {"rollout": {"candidate_model": f"{CAND_SHA}.pt"}, "model_bucket": None},
            "rollout.candidate_model",
            "without model_bucket",
        ),
    ],
)
def test_group_mode_names_the_files_by_digest(with_overrides, overrides, key, says):
    values = with_overrides("aws-prod", **overrides)
    raw = {k.split(":", 1)[1]: v for k, v in values.items()}
    with pytest.raises(config.ConfigError) as err:
        config.load(raw, "aws-prod")
    assert key in str(err.value) and says in str(err.value)


def test_working_hours_stop_the_candidate_group_too(with_overrides):
    """A schedule's stop sets every group of the stack to 0, the candidate's included; its start
    gives the candidate group the split's size again."""
    hours = {"timezone": "Europe/Berlin", "start": "08:00", "stop": "20:00", "days": "MON-FRI"}
    values = with_overrides(
        "aws-prod",
        schedule=hours,
        rollout={"candidate_weight": 10, "candidate_model": f"{CAND_SHA}.pt"},
    )
    run = run_offline("aws-prod", values)
    actions = {
        (s.inputs["autoscalingGroupName"], s.inputs["scheduledActionName"]): s.inputs
        for s in run.of_type("aws:autoscaling/schedule:Schedule")
    }
    group = "torchfleet-aws-prod-candidate-asg"
    assert actions[(group, "work-stop")]["desiredCapacity"] == 0
    start = actions[(group, "work-start")]
    assert (start["minSize"], start["maxSize"], start["desiredCapacity"]) == (1, 1, 1)


def test_the_stack_outputs_name_each_track_s_cloudwatch_dimensions(with_overrides):
    """`rollout_metrics`: what CloudWatchSource reads a window by (the ALB's ARN suffix, each
    target group's), the very values the requests-per-node scaling policy's resource label
    joins; the candidate's only while a `rollout` block makes its target group."""
    run = _run(with_overrides, candidate_weight=10, candidate_model=f"{CAND_SHA}.pt")
    out = run.outputs["rollout_metrics"]
    assert out["namespace"] == "AWS/ApplicationELB"
    assert set(out["target_groups"]) == {"stable", "candidate"}
    assert (
        out["load_balancer"].startswith("app/") and "candidate" in out["target_groups"]["candidate"]
    )
    (policy,) = [
        p.inputs
        for p in run.of_type("aws:autoscaling/policy:Policy")
        if p.inputs.get("policyType") == "TargetTrackingScaling" and "requests" in p.inputs["name"]
    ]
    spec = policy["targetTrackingConfiguration"]["predefinedMetricSpecification"]
    assert spec["resourceLabel"] == f"{out['load_balancer']}/{out['target_groups']['stable']}"
    assert out["target_groups"]["candidate"] != out["target_groups"]["stable"]

    without = run_offline("aws-prod", with_overrides("aws-prod", rollout=None)).outputs
    assert without["rollout_metrics"]["target_groups"] == {"stable": out["target_groups"]["stable"]}
    assert "rollout_metrics" not in run_offline("aws-dev", with_overrides("aws-dev")).outputs
