"""A rollout on an Alibaba group stack in the program, under the mock engine over
alicloud-prod: the CLB's listener forwards to one VServer group, the stable ESS group attached
to it at STABLE_BACKEND_WEIGHT per node (no longer the CLB's default server group); while the
`rollout` block gives the candidate a share and names its model, a candidate ESS group in the
same VServer group at the weight that gives the share, its nodes' node config carrying the
candidate's model and checksum (and no secret); at weight 0, or without the block, no
candidate group. And the block's Alibaba refusals name the key and the allowed values."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from infra import config
from infra.bootstrap.torchfleet_agent import boot
from infra.config import STABLE_BACKEND_WEIGHT, RolloutSplit
from infra.offline import run_offline

ESS = "alicloud:ess/scalingGroup:ScalingGroup"
ESS_CONFIG = "alicloud:ess/scalingConfiguration:ScalingConfiguration"
ATTACH = "alicloud:ess/scalingGroupVServerGroups:ScalingGroupVServerGroups"
VSERVER = "alicloud:slb/serverGroup:ServerGroup"
LISTENER = "alicloud:slb/listener:Listener"
CAND_SHA, STABLE_SHA = "c" * 64, "5" * 64
BUCKET = "example-torchfleet-models"
STABLE, CANDIDATE = "torchfleet-alicloud-prod-ess", "torchfleet-alicloud-prod-candidate-ess"


def _node_config(inputs: dict) -> dict:
    doc = yaml.safe_load(base64.b64decode(inputs["userData"]).decode())
    (entry,) = [f for f in doc["write_files"] if f["path"] == boot.CONFIG]
    return json.loads(entry["content"])


def _groups(run) -> dict[str, dict]:
    """Scaling groups by name, each with its attachment's (VServer group, port, weight) and
    its active configuration's node config."""
    ids = {f"{g.name}-id": g.inputs["scalingGroupName"] for g in run.of_type(ESS)}
    out: dict[str, dict] = {name: {"inputs": None, "attached": []} for name in ids.values()}
    for g in run.of_type(ESS):
        out[g.inputs["scalingGroupName"]]["inputs"] = g.inputs
    for a in run.of_type(ATTACH):
        for vg in a.inputs["vserverGroups"]:
            for attr in vg["vserverAttributes"]:
                out[ids[a.inputs["scalingGroupId"]]]["attached"].append(
                    (attr["vserverGroupId"], int(attr["port"]), int(attr["weight"]))
                )
    for c in run.of_type(ESS_CONFIG):
        out[ids[c.inputs["scalingGroupId"]]]["node"] = _node_config(c.inputs)
    return out


def _run(with_overrides, **block):
    return run_offline(
        "alicloud-prod", with_overrides("alicloud-prod", model_bucket=BUCKET, rollout=block)
    )


def test_the_listener_forwards_to_the_vserver_group_the_stable_group_is_attached_to(runs, settings):
    run, port = runs["alicloud-prod"], settings("alicloud-prod")["service_port"]
    (backends,) = run.of_type(VSERVER)
    vserver = f"{backends.name}-id"
    (clb,) = run.of_type("alicloud:slb/applicationLoadBalancer:ApplicationLoadBalancer")
    assert backends.inputs["loadBalancerId"] == f"{clb.name}-id"
    (serving,) = [li for li in run.of_type(LISTENER) if li.inputs.get("healthCheck") == "on"]
    assert serving.inputs["serverGroupId"] == vserver
    # ...once the VServer group holds the stable nodes (a running stack's move)
    (attach,) = run.of_type(ATTACH)
    assert attach.urn in serving.dependencies
    groups = _groups(run)
    assert set(groups) == {STABLE}
    stable = groups[STABLE]
    assert stable["attached"] == [(vserver, port, STABLE_BACKEND_WEIGHT)]
    # no longer the default server group: one way in, the VServer group
    assert not stable["inputs"].get("loadbalancerIds")
    assert stable["inputs"]["healthCheckTypes"] == ["LOAD_BALANCER"]
    # the nodes leave the VServer group before a drain, and the bundle's model serves
    node = stable["node"]
    assert node["vserver_group_id"] == vserver and node["load_balancer_id"] == f"{clb.name}-id"
    assert "model" not in node


def test_a_candidate_group_serves_the_candidate_model_in_the_vserver_group_at_its_weight(
    with_overrides, settings
):
    run = _run(with_overrides, candidate_weight=10, candidate_model=f"{CAND_SHA}.pt")
    groups = _groups(run)
    assert set(groups) == {STABLE, CANDIDATE}
    stable, cand = groups[STABLE], groups[CANDIDATE]
    # alicloud-prod: nodes min 2, max 6. 10 % beside 2 stable nodes at 50: one node at 11
    nodes = settings("alicloud-prod")["nodes"]
    assert (nodes["min"], nodes["max"]) == (2, 6)
    size = (cand["inputs"]["minSize"], cand["inputs"]["maxSize"], cand["inputs"]["desiredCapacity"])
    assert size == (1, 1, 1)
    (vserver, port, weight) = cand["attached"][0]
    assert cand["attached"] == [(vserver, port, 11)] and stable["attached"][0][0] == vserver
    assert stable["attached"] == [(vserver, port, STABLE_BACKEND_WEIGHT)]  # never moves
    share = 100 * 1 * 11 / (1 * 11 + 2 * STABLE_BACKEND_WEIGHT)
    assert abs(share - 10) < 0.5
    # the stable group's nodes: the same types, vSwitches, spot settings, health check
    same = (
        "vswitchIds",
        "healthCheckTypes",
        "multiAzPolicy",
        "onDemandBaseCapacity",
        "spotInstancePools",
        "spotInstanceRemedy",
        "compensateWithOnDemand",
        "removalPolicies",
    )
    assert {k: cand["inputs"].get(k) for k in same} == {k: stable["inputs"].get(k) for k in same}
    assert cand["inputs"]["tags"]["torchfleet-track"] == "candidate"
    # its nodes' node config: the candidate's model and checksum, its own group
    node = cand["node"]
    assert node["model"] == {
        "source": f"oss://{BUCKET}/models/{CAND_SHA}.pt",
        "checksum": f"sha256:{CAND_SHA}",
    }
    assert node["group_name"] == CANDIDATE
    assert node["group_id"] == "fleet-candidate-group-id"
    assert node["vserver_group_id"] == vserver
    assert "model" not in stable["node"]
    # no secret: the token's secret is named, never its value
    token = run.outputs["api_token"]
    assert token and token not in json.dumps(node)
    assert [k for k in node if "token" in k or "secret" in k] == ["api_token_secret"]
    # the candidate's own lifecycle hooks, and its nodes may complete them
    hooks = [h.inputs for h in run.of_type("alicloud:ess/lifecycleHook:LifecycleHook")]
    assert sorted(h["name"] for h in hooks if h["scalingGroupId"] == node["group_id"]) == [
        "torchfleet-launch",
        "torchfleet-terminate",
    ]
    (grant,) = [
        json.loads(p.inputs["policyDocument"])
        for p in run.of_type("alicloud:ram/policy:Policy")
        if "ess:CompleteLifecycleAction" in p.inputs["policyDocument"]
    ]
    granted = [r.rsplit("/", 1)[1] for r in grant["Statement"][0]["Resource"]]
    assert granted == ["fleet-group-id", "fleet-candidate-group-id"]
    # no scaling rules of its own: the split declares its size
    rules = run.of_type("alicloud:ess/scalingRule:ScalingRule")
    assert {r.inputs["scalingGroupId"] for r in rules} == {"fleet-group-id"}


@pytest.mark.parametrize(
    ("weight", "size", "per_node"), [(25, 1, 33), (50, 2, 50), (75, 4, 75), (80, 4, 100)]
)
def test_the_candidate_grows_with_the_weight_up_to_the_most_its_weights_give(
    with_overrides, weight, size, per_node
):
    run = _run(with_overrides, candidate_weight=weight, candidate_model=f"{CAND_SHA}.pt")
    cand = _groups(run)[CANDIDATE]
    assert cand["inputs"]["desiredCapacity"] == size
    assert [w for _, _, w in cand["attached"]] == [per_node]
    split = RolloutSplit(candidate_weight=weight)
    assert abs(split.backend_share(2, 6) - weight) < 1


def test_without_a_share_or_a_model_there_is_no_candidate_group(with_overrides, runs):
    before = runs["alicloud-prod"]
    run = _run(with_overrides, candidate_weight=0, candidate_model=f"{CAND_SHA}.pt")
    assert set(_groups(run)) == set(_groups(before)) == {STABLE}
    assert not [r for r in run.resources if "candidate" in r.name]
    assert len(run.of_type(ATTACH)) == 1


def test_stable_model_moves_the_stable_groups_new_nodes(with_overrides, runs):
    """A promotion's file in the stable group's node config: a new scaling configuration (the
    nodes ESS starts from then on; running nodes keep theirs, infra/alicloud/fleet.py)."""
    run = _run(with_overrides, candidate_weight=0, stable_model=f"{STABLE_SHA}.pt")
    node = _groups(run)[STABLE]["node"]
    assert node["model"] == {
        "source": f"oss://{BUCKET}/models/{STABLE_SHA}.pt",
        "checksum": f"sha256:{STABLE_SHA}",
    }


@pytest.mark.parametrize("sticky", [0, 3600])
def test_sticky_s_is_the_clbs_inserted_cookie_on_the_serving_listener(with_overrides, sticky):
    run = _run(
        with_overrides, candidate_weight=10, candidate_model=f"{CAND_SHA}.pt", sticky_s=sticky
    )
    (serving,) = [li for li in run.of_type(LISTENER) if li.inputs.get("healthCheck") == "on"]
    if sticky:
        assert (serving.inputs["stickySession"], serving.inputs["stickySessionType"]) == (
            "on",
            "insert",
        )
        assert serving.inputs["cookieTimeout"] == sticky
    else:
        assert "stickySession" not in serving.inputs and "cookieTimeout" not in serving.inputs


@pytest.mark.parametrize(
    ("block", "key", "says"),
    [
        (
            {"candidate_weight": 90, "candidate_model": f"{CAND_SHA}.pt"},
            "rollout.candidate_weight",
            "0..80 on alicloud in mode: group with nodes.min 2 and nodes.max 6",
        ),
        (
            {"sticky_s": 86401},
            "rollout.sticky_s",
            "0 (off) or seconds up to 86400 on alicloud in mode: group",
        ),
        ({"candidate_weight": 10}, "rollout.candidate_model", "set while candidate_weight"),
    ],
)
def test_alicloud_group_refusals_name_the_key(with_overrides, block, key, says):
    values = with_overrides("alicloud-prod", model_bucket=BUCKET, rollout=block)
    raw = {k.split(":", 1)[1]: v for k, v in values.items()}
    with pytest.raises(config.ConfigError) as err:
        config.load(raw, "alicloud-prod")
    assert key in str(err.value) and says in str(err.value)


@pytest.mark.parametrize(
    ("stable_min", "most", "weight", "size", "per_node"),
    [
        (2, 6, 10, 1, 11),
        (2, 6, 80, 4, 100),
        (1, 3, 50, 1, 50),
        (3, 10, 40, 2, 50),
        (0, 4, 30, 1, 100),  # no stable minimum: the candidate's nodes at the most
    ],
)
def test_backend_weight_rule(stable_min, most, weight, size, per_node):
    split = RolloutSplit(candidate_weight=weight)
    assert split.candidate_size(stable_min, most) == size
    assert split.backend_weight(stable_min, most) == per_node
    assert RolloutSplit(candidate_weight=0).backend_weight(stable_min, most) == 0


def test_working_hours_stop_the_candidate_group_too(with_overrides):
    """A schedule's stop sets every group of the stack to 0, the candidate's included; its start
    gives the candidate group the split's size again."""
    hours = {"timezone": "Asia/Shanghai", "start": "08:00", "stop": "20:00", "days": "MON-FRI"}
    values = with_overrides(
        "alicloud-prod",
        model_bucket=BUCKET,
        schedule=hours,
        rollout={"candidate_weight": 50, "candidate_model": f"{CAND_SHA}.pt"},
    )
    run = run_offline("alicloud-prod", values)
    tasks = {
        (t.inputs["scalingGroupId"], t.inputs["scheduledTaskName"].rsplit("-", 1)[1]): t.inputs
        for t in run.of_type("alicloud:ess/scheduledTask:ScheduledTask")
    }
    stop, start = (
        tasks[("fleet-candidate-group-id", "stop")],
        tasks[("fleet-candidate-group-id", "start")],
    )
    assert (stop["minValue"], stop["maxValue"], stop["desiredCapacity"]) == (0, 0, 0)
    assert (start["minValue"], start["maxValue"], start["desiredCapacity"]) == (2, 2, 2)
    assert ("fleet-group-id", "stop") in tasks
