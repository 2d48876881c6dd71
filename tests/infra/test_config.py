"""Config validation: every bad value names the key, the value and what is allowed."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, load


def base(settings, stack="aws-dev", **overrides):
    raw = dict(settings(stack))
    for k, v in overrides.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return raw


def problems(raw, stack="aws-dev") -> str:
    with pytest.raises(ConfigError) as err:
        load(raw, stack)
    return str(err.value)


def test_example_stacks_load(settings):
    for stack in ("aws-dev", "aws-prod", "alicloud-dev", "alicloud-prod"):
        cfg = load(settings(stack), stack)
        assert cfg.stack == stack and cfg.cloud == stack.split("-")[0]


def test_unknown_instance_type(settings):
    msg = problems(base(settings, gpu=None, instance_type="g9.xlarge"))
    assert "torchfleet:instance_type = 'g9.xlarge'" in msg and "g5.xlarge" in msg


def test_cuda_profile_that_cannot_drive_the_gpu(settings):
    msg = problems(base(settings, cuda_profile="cu116"))  # aws-dev runs L4 (sm_89)
    assert "torchfleet:cuda_profile = 'cu116'" in msg
    assert "8.9" in msg and "cu118, cu121" in msg
    msg = problems(base(settings, gpu={"model": "H100", "count": 8}, cuda_profile="cu116"))
    assert "H100" in msg and "9.0" in msg and "cu118, cu121" in msg
    # the same profile on an Ampere GPU is fine
    assert load(base(settings, gpu={"model": "A10G", "count": 1}, cuda_profile="cu116"),
                "aws-dev").cuda_profile == "cu116"


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "0.0.0.0/1"])
def test_ssh_from_the_internet_is_refused(settings, cidr):
    msg = problems(base(settings, admin_cidrs=[cidr]))
    assert f"torchfleet:admin_cidrs = '{cidr}'" in msg and "/8 or narrower" in msg


def test_client_cidrs_world_open_refused(settings):
    assert "torchfleet:client_cidrs = '0.0.0.0/0'" in problems(
        base(settings, "aws-prod", client_cidrs=["0.0.0.0/0"]), "aws-prod")


@pytest.mark.parametrize("ratio", [0, -0.5, 1.31, "cheap"])
def test_price_ratio_bounds(settings, ratio):
    msg = problems(base(settings, spot={"enabled": True, "max_price_ratio": ratio,
                                        "interruption": "stop"}))
    assert "torchfleet:spot.max_price_ratio" in msg and "<= 1.3" in msg


@pytest.mark.parametrize("schedule,key", [
    ({"timezone": "Europe/Berlin", "start": "08:00", "stop": "08:00"}, "schedule.stop"),
    ({"timezone": "Europe/Berlin", "start": "08:00", "stop": "19:00", "days": []},
     "schedule.days"),
    ({"timezone": "Mars/Olympus", "start": "08:00", "stop": "19:00"}, "schedule.timezone"),
    ({"timezone": "UTC", "start": "8am", "stop": "19:00"}, "schedule.start"),
    ({"timezone": "UTC", "start": "08:00", "stop": "19:00", "days": "MON-FUN"}, "schedule.days"),
])
def test_schedules_that_never_run(settings, schedule, key):
    assert f"torchfleet:{key} =" in problems(base(settings, schedule=schedule))


def test_unknown_keys_are_named(settings):
    msg = problems(base(settings, instance_typo="g5.xlarge"))
    assert "torchfleet:instance_typo" in msg and "instance_type" in msg
    msg = problems(base(settings, spot={"enabled": True, "max_price": 1, "interruption": "stop"}))
    assert "torchfleet:spot.max_price" in msg and "max_price_ratio" in msg


def test_ttl_rules(settings):
    assert "torchfleet:ttl_hours = None" in problems(base(settings, ttl_hours=None))
    assert "unset in prod" in problems(base(settings, "aws-prod", ttl_hours=4), "aws-prod")
    assert "torchfleet:ttl_hours = 0.2" in problems(base(settings, ttl_hours=0.2))


def test_dev_needs_a_schedule(settings):
    assert "torchfleet:schedule = None" in problems(base(settings, schedule=None))


def test_aws_scheduled_spot_must_be_stoppable(settings):
    msg = problems(base(settings, spot={"enabled": True, "max_price_ratio": 0.9,
                                        "interruption": "terminate"}))
    assert "torchfleet:spot.interruption = 'terminate'" in msg and "stop | hibernate" in msg


def test_group_mode_needs_two_zones(settings):
    msg = problems(base(settings, "aws-prod", zones=["us-east-1a"]), "aws-prod")
    assert "torchfleet:zones" in msg and "at least 2 zones" in msg


def test_cloud_specific_values(settings):
    msg = problems(base(settings, "alicloud-dev", spot={"enabled": True, "interruption":
                                                        "hibernate"}), "alicloud-dev")
    assert "torchfleet:spot.interruption = 'hibernate'" in msg and "terminate | stop" in msg
    msg = problems(base(settings, "alicloud-dev", budget={"alert_emails": ["a@b.c"]}),
                   "alicloud-dev")
    assert "torchfleet:budget" in msg
    assert "torchfleet:zones = 'us-east-1a'" in problems(base(settings, zones=["us-east-1a"]))
    assert "torchfleet:cloud = 'alicloud'" in problems(base(settings, cloud="alicloud"))


def test_every_problem_is_reported_at_once(settings):
    err = problems(base(settings, admin_cidrs=["0.0.0.0/0"], service_port=22, disk_gb=10,
                        owner=None, ssh_public_key="not a key"))
    for key in ("admin_cidrs", "service_port", "disk_gb", "owner", "ssh_public_key"):
        assert f"torchfleet:{key}" in err


def test_structured_values_arrive_as_json_strings(settings):
    import json
    raw = {k: json.dumps(v) if isinstance(v, (dict, list)) else v
           for k, v in settings("aws-prod").items()}
    raw["nodes"] = json.dumps({"min": 1, "desired": 2, "max": 4})
    cfg = load(raw, "aws-prod")
    assert (cfg.nodes.min, cfg.nodes.desired, cfg.nodes.max) == (1, 2, 4)
    assert [t.name for t in cfg.instance_types] == ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]
    assert "torchfleet:nodes = " in problems({**raw, "nodes": "{not json"}, "aws-prod")


def test_extra_types_must_share_the_gpus(settings):
    msg = problems(base(settings, "aws-prod", extra_instance_types=["g6.xlarge"]), "aws-prod")
    assert "torchfleet:extra_instance_types = 'g6.xlarge'" in msg and "1x A10G" in msg


def test_on_demand_price_override_moves_the_cap(settings):
    raw = base(settings, spot={"enabled": True, "max_price_ratio": 0.5, "interruption": "stop",
                               "on_demand_prices": {"g6.xlarge": 2.0}})
    cfg = load(raw, "aws-dev")
    assert cfg.spot_cap(cfg.instance_type) == 1.0
