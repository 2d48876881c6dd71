"""The rollout's traffic split in the Pulumi programs, under the mock engine on every example
stack: without a `rollout` block nothing of it exists (today's plan); with one, AWS forwards by
weight to the stable and the candidate target groups (sticky when asked), Kubernetes runs a
candidate Deployment beside the stable one with the split by replicas. And the block's
refusals (mode: instances has no load balancer; bad values name the key)."""

from __future__ import annotations

import pytest

from infra import config
from infra.offline import run_offline
from infra.plan import ALL_STACKS

LISTENER = "aws:lb/listener:Listener"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def _forwards(run) -> list[dict]:
    return [
        a
        for li in run.of_type(LISTENER)
        for a in li.inputs["defaultActions"]
        if a["type"] == "forward"
    ]


def _group_of(arn: str) -> str:
    """The mock engine's ARNs end with the resource's name + "-id" (infra.offline)."""
    return arn.rsplit(":", 1)[-1].removesuffix("-id")


def test_without_a_rollout_block_nothing_of_it_exists(every):
    checked = 0
    for stack in ALL_STACKS:
        run = every[stack]
        assert not [r for r in run.resources if "candidate" in r.name], stack
        for action in _forwards(run):
            assert "forward" not in action and action["targetGroupArn"], (stack, action)
            checked += 1
        for d in run.of_type(DEPLOYMENT):
            assert "track" not in d.inputs["spec"]["selector"]["matchLabels"]
            checked += 1
    assert checked >= 3  # aws-prod's listener, the two clusters' Deployments


def test_aws_forwards_by_weight_to_the_stable_and_candidate_groups(with_overrides):
    split = {"candidate_weight": 10, "sticky_s": 3600, "candidate_model": "c" * 64 + ".pt"}
    run = run_offline("aws-prod", with_overrides("aws-prod", rollout=split))
    groups = {r.name: r for r in run.of_type(TARGET_GROUP)}
    stable = next(r for n, r in groups.items() if n.endswith("-tg"))
    candidate = next(r for n, r in groups.items() if n.endswith("-tg-candidate"))
    # the candidate group answers the same health check on the same port
    assert candidate.inputs["healthCheck"] == stable.inputs["healthCheck"]
    assert candidate.inputs["port"] == stable.inputs["port"]
    (action,) = _forwards(run)
    weights = {_group_of(tg["arn"]): tg["weight"] for tg in action["forward"]["targetGroups"]}
    assert weights == {stable.name: 90, candidate.name: 10}
    assert action["forward"]["stickiness"] == {"enabled": True, "duration": 3600}
    # the Auto Scaling groups (spot and fallback) still register their nodes in the stable one,
    # the candidate group (tests/infra/test_rollout_groups.py) in the candidate one
    groups_of_asgs = {
        g.name: [_group_of(a) for a in g.inputs["targetGroupArns"]]
        for g in run.of_type("aws:autoscaling/group:Group")
    }
    candidates = {n: v for n, v in groups_of_asgs.items() if "candidate" in n}
    assert list(candidates.values()) == [[candidate.name]]
    stables = [v for n, v in groups_of_asgs.items() if n not in candidates]
    assert stables and all(names == [stable.name] for names in stables)


def test_aws_weight_zero_keeps_the_candidate_group_without_traffic(with_overrides):
    run = run_offline("aws-prod", with_overrides("aws-prod", rollout={}))
    (action,) = _forwards(run)
    assert [tg["weight"] for tg in action["forward"]["targetGroups"]] == [100, 0]
    assert "stickiness" not in action["forward"]


@pytest.mark.parametrize("stack", ["aws-k8s", "alicloud-k8s"])
def test_kubernetes_runs_a_candidate_deployment_split_by_replicas(stack, with_overrides, settings):
    k = settings(stack)["kubernetes"]
    run = run_offline(
        stack,
        with_overrides(stack, rollout={"candidate_weight": 25, "candidate_model": "v2.pt"}),
    )
    by_name = {d.inputs["metadata"]["name"]: d.inputs for d in run.of_type(DEPLOYMENT)}
    stable, cand = by_name["torchfleet-runtime"], by_name["torchfleet-runtime-candidate"]
    assert stable["spec"]["replicas"] == k["replicas"]["min"]
    expected = max(1, round(k["replicas"]["min"] * 25 / 75))
    assert cand["spec"]["replicas"] == expected
    assert cand["spec"]["selector"]["matchLabels"]["track"] == "candidate"
    assert cand["spec"]["template"]["metadata"]["labels"]["track"] == "candidate"

    def env(d: dict) -> dict[str, str]:
        (c,) = d["spec"]["template"]["spec"]["containers"]
        return {v["name"]: v["value"] for v in c["env"]}

    assert env(cand)["TORCHFLEET_MODEL"] == "/models/v2.pt"
    assert env(stable)["TORCHFLEET_MODEL"] == "/models/model.pt"
    # the Service selects both tracks: its selector is a subset of the candidate's pod labels
    (svc,) = run.of_type("kubernetes:core/v1:Service")
    labels = cand["spec"]["template"]["metadata"]["labels"]
    assert svc.inputs["spec"]["selector"].items() <= labels.items()
    # the stable Deployment and the candidate differ only where the split says
    cand_spec = {**cand["spec"]["template"]["spec"], "containers": None}
    stable_spec = {**stable["spec"]["template"]["spec"], "containers": None}
    cand_spec.pop("topologySpreadConstraints")
    stable_spec.pop("topologySpreadConstraints")
    assert cand_spec == stable_spec


@pytest.mark.parametrize("stack", ["aws-k8s", "alicloud-k8s"])
def test_kubernetes_exports_where_its_workload_is_and_serves_the_stable_model(
    stack, with_overrides
):
    """`torchfleet up|status|rollout` find the Deployments and the Service by the `workload`
    output; a promotion's stable_model is the stable Deployment's file."""
    run = run_offline(stack, with_overrides(stack, rollout={"stable_model": "v2.pt"}))
    names = run.outputs["workload"]
    deployments = {d.inputs["metadata"]["name"]: d.inputs for d in run.of_type(DEPLOYMENT)}
    assert set(deployments) == {names["deployment"], names["candidate_deployment"]}
    (svc,) = run.of_type("kubernetes:core/v1:Service")
    assert svc.inputs["metadata"]["name"] == names["service"]
    assert {d["metadata"]["namespace"] for d in deployments.values()} == {names["namespace"]}
    (c,) = deployments[names["deployment"]]["spec"]["template"]["spec"]["containers"]
    assert {v["name"]: v["value"] for v in c["env"]}["TORCHFLEET_MODEL"] == "/models/v2.pt"
    # and the kubeconfig the command reads is a secret output
    assert "kubeconfig" in run.secret_outputs


def test_candidate_replicas_give_the_weight():
    split = config.RolloutSplit
    assert split(0).candidate_replicas(3) == 0
    assert split(50).candidate_replicas(3) == 3
    assert split(10).candidate_replicas(2) == 1  # at least one while above 0
    assert split(75).candidate_replicas(2) == 6


@pytest.mark.parametrize(
    ("stack", "block", "key", "says"),
    [
        ("aws-dev", {"candidate_weight": 10}, "rollout", "mode: instances"),
        ("alicloud-prod", {"sticky_s": 90000}, "rollout.sticky_s", "up to 86400 on alicloud"),
        ("aws-prod", {"candidate_weight": 101}, "rollout.candidate_weight", "0..100"),
        ("aws-prod", {"candidate_weight": "ten"}, "rollout.candidate_weight", "0..100"),
        ("aws-prod", {"sticky_s": 10**6}, "rollout.sticky_s", "604800"),
        ("aws-prod", {"weight": 5}, "rollout.weight", "candidate_weight"),
        ("aws-k8s", {"candidate_weight": 100}, "rollout.candidate_weight", "0..99"),
        ("aws-k8s", {"candidate_model": "../x.pt"}, "rollout.candidate_model", ".pt"),
        ("aws-k8s", {"shadow_model": "../s.pt"}, "rollout.shadow_model", "ending .pt"),
        ("aws-prod", {"shadow_model": "s.pt"}, "rollout.shadow_model", "outside mode: kubernetes"),
        ("aws-k8s", {"stable_model": "model"}, "rollout.stable_model", "model.pt"),
    ],
)
def test_a_bad_rollout_block_names_the_key(stack, block, key, says, settings):
    raw = {**settings(stack), "rollout": block}
    with pytest.raises(config.ConfigError) as err:
        config.load(raw, stack)
    text = str(err.value)
    assert f"{key} = " in text and says in text, text
