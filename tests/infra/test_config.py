"""Config validation: every bad value names the key, the value and what is allowed."""

from __future__ import annotations

import json

import pytest

from infra.config import REQUIRED, ConfigError, load
from infra.lifecycle import LAUNCH_TIMEOUT_DEFAULT_S


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
    # the same profile on an Ampere GPU is fine (on a distro whose Python it supports)
    assert (
        load(
            base(
                settings,
                gpu={"model": "A10G", "count": 1},
                cuda_profile="cu116",
                image_distro="debian-11",
            ),
            "aws-dev",
        ).cuda_profile
        == "cu116"
    )


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "0.0.0.0/1"])
def test_ssh_from_the_internet_is_refused(settings, cidr):
    msg = problems(base(settings, admin_cidrs=[cidr]))
    assert f"torchfleet:admin_cidrs = '{cidr}'" in msg and "/8 or narrower" in msg


def test_client_cidrs_world_open_refused(settings):
    assert "torchfleet:client_cidrs = '0.0.0.0/0'" in problems(
        base(settings, "aws-prod", client_cidrs=["0.0.0.0/0"]), "aws-prod"
    )


@pytest.mark.parametrize("ratio", [0, -0.5, 1.31, "cheap"])
def test_price_ratio_bounds(settings, ratio):
    msg = problems(
        base(settings, spot={"enabled": True, "max_price_ratio": ratio, "interruption": "stop"})
    )
    assert "torchfleet:spot.max_price_ratio" in msg and "<= 1.3" in msg


@pytest.mark.parametrize(
    "schedule,key",
    [
        ({"timezone": "Europe/Berlin", "start": "08:00", "stop": "08:00"}, "schedule.stop"),
        (
            {"timezone": "Europe/Berlin", "start": "08:00", "stop": "19:00", "days": []},
            "schedule.days",
        ),
        ({"timezone": "Mars/Olympus", "start": "08:00", "stop": "19:00"}, "schedule.timezone"),
        ({"timezone": "UTC", "start": "8am", "stop": "19:00"}, "schedule.start"),
        (
            {"timezone": "UTC", "start": "08:00", "stop": "19:00", "days": "MON-FUN"},
            "schedule.days",
        ),
    ],
)
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
    msg = problems(
        base(settings, spot={"enabled": True, "max_price_ratio": 0.9, "interruption": "terminate"})
    )
    assert "torchfleet:spot.interruption = 'terminate'" in msg and "stop | hibernate" in msg


def test_group_mode_needs_two_zones(settings):
    msg = problems(base(settings, "aws-prod", zones=["us-east-1a"]), "aws-prod")
    assert "torchfleet:zones" in msg and "at least 2 zones" in msg


def test_cloud_specific_values(settings):
    msg = problems(
        base(settings, "alicloud-dev", spot={"enabled": True, "interruption": "hibernate"}),
        "alicloud-dev",
    )
    assert "torchfleet:spot.interruption = 'hibernate'" in msg and "terminate | stop" in msg
    msg = problems(
        base(settings, "alicloud-dev", budget={"alert_emails": ["a@b.c"]}), "alicloud-dev"
    )
    assert "torchfleet:budget" in msg
    assert "torchfleet:zones = 'us-east-1a'" in problems(base(settings, zones=["us-east-1a"]))
    assert "torchfleet:cloud = 'alicloud'" in problems(base(settings, cloud="alicloud"))


def test_every_problem_is_reported_at_once(settings):
    err = problems(
        base(
            settings,
            admin_cidrs=["0.0.0.0/0"],
            service_port=22,
            disk_gb=10,
            owner=None,
            ssh_public_key="not a key",
        )
    )
    for key in ("admin_cidrs", "service_port", "disk_gb", "owner", "ssh_public_key"):
        assert f"torchfleet:{key}" in err


def test_structured_values_arrive_as_json_strings(settings):
    import json

    raw = {
        k: json.dumps(v) if isinstance(v, (dict, list)) else v
        for k, v in settings("aws-prod").items()
    }
    raw["nodes"] = json.dumps({"min": 1, "desired": 2, "max": 4})
    cfg = load(raw, "aws-prod")
    assert (cfg.nodes.min, cfg.nodes.desired, cfg.nodes.max) == (1, 2, 4)
    assert [t.name for t in cfg.instance_types] == ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]
    assert "torchfleet:nodes = " in problems({**raw, "nodes": "{not json"}, "aws-prod")


def test_extra_types_must_share_the_gpus(settings):
    msg = problems(base(settings, "aws-prod", extra_instance_types=["g6.xlarge"]), "aws-prod")
    assert "torchfleet:extra_instance_types = 'g6.xlarge'" in msg and "1x A10G" in msg


def test_on_demand_price_override_moves_the_cap(settings):
    raw = base(
        settings,
        spot={
            "enabled": True,
            "max_price_ratio": 0.5,
            "interruption": "stop",
            "on_demand_prices": {"g6.xlarge": 2.0},
        },
    )
    cfg = load(raw, "aws-dev")
    assert cfg.spot_cap(cfg.instance_type) == 1.0


# -- issue 8: review fixes (each failed before the fix) -----------------------------------------


@pytest.mark.parametrize("value", [float("nan"), "nan", "NaN", float("inf"), "-inf"])
def test_nan_and_inf_price_ratio_refused(settings, value):
    msg = problems(
        base(settings, spot={"enabled": True, "max_price_ratio": value, "interruption": "stop"})
    )
    assert "torchfleet:spot.max_price_ratio" in msg and "<= 1.3" in msg


@pytest.mark.parametrize("value", [float("nan"), "nan", float("inf"), "inf"])
def test_nan_and_inf_ttl_refused(settings, value):
    msg = problems(base(settings, ttl_hours=value))
    assert "torchfleet:ttl_hours" in msg and "1..720" in msg


def test_more_zones_than_the_address_plan_refused(settings):
    from infra.addressing import MAX_ZONES

    zones = [f"eu-central-1{chr(ord('a') + i)}" for i in range(MAX_ZONES + 1)]
    msg = problems(base(settings, zones=zones))
    assert "torchfleet:zones" in msg and f"at most {MAX_ZONES} zones" in msg
    assert load(base(settings, zones=zones[:MAX_ZONES]), "aws-dev").zones == tuple(
        zones[:MAX_ZONES]
    )


# -- issue 8: scaling, boot path, warm pool -----------------------------------------------------


def test_group_mode_needs_a_request_target(settings):
    msg = problems(base(settings, "aws-prod", scaling=None), "aws-prod")
    assert (
        "torchfleet:scaling.requests_per_node = None" in msg and "torchfleet-bench load URL" in msg
    )
    msg = problems(
        base(settings, "alicloud-prod", scaling={"requests_per_node": 0}), "alicloud-prod"
    )
    assert "torchfleet:scaling.requests_per_node = 0" in msg


def test_scaling_values(settings):
    cfg = load(base(settings, "aws-prod"), "aws-prod")
    assert cfg.scaling.requests_per_node == 1200 and cfg.scaling.scale_in is True
    assert cfg.scaling.queue_depth_per_node is None
    assert cfg.scaling.launch_timeout_s == LAUNCH_TIMEOUT_DEFAULT_S
    msg = problems(
        base(
            settings,
            "aws-prod",
            scaling={
                "requests_per_node": 600,
                "launch_timeout_s": 9000,
                "scale_in": "maybe",
                "queue_depth_per_node": -1,
                "cooldown": 5,
            },
        ),
        "aws-prod",
    )
    for fragment in (
        "torchfleet:scaling.launch_timeout_s = 9000",
        "300..7200",
        "torchfleet:scaling.scale_in = 'maybe'",
        "true | false",
        "torchfleet:scaling.queue_depth_per_node = -1",
        "torchfleet:scaling.cooldown",
        "requests_per_node",
    ):
        assert fragment in msg, fragment
    assert "torchfleet:scaling =" in problems(base(settings, scaling={"requests_per_node": 60}))


def test_boot_paths(settings):
    assert load(base(settings, "aws-prod", boot="bake"), "aws-prod").bootstrap_mode == "baked"
    assert "torchfleet:boot = 'warm'" in problems(base(settings, boot="warm"))
    msg = problems(base(settings, "alicloud-prod", boot="bake"), "alicloud-prod")
    assert "torchfleet:boot = 'bake'" in msg and "cold | baked on alicloud" in msg
    msg = problems(base(settings, boot="baked"))
    assert "torchfleet:boot = 'baked'" in msg and "needs `image`" in msg
    cfg = load(base(settings, boot="baked", image="ami-0123456789abcdef0"), "aws-dev")
    assert cfg.bootstrap_mode == "baked"


def test_warm_pool_rules(settings):
    on_demand = {"enabled": False}
    cfg = load(
        base(
            settings,
            "aws-prod",
            spot=on_demand,
            extra_instance_types=None,
            warm_pool={"min_size": 1},
        ),
        "aws-prod",
    )
    assert cfg.warm_pool.min_size == 1 and [t.name for t in cfg.instance_types] == ["g5.xlarge"]
    msg = problems(base(settings, "aws-prod", warm_pool={"enabled": True}), "aws-prod")
    assert "torchfleet:warm_pool = 'enabled'" in msg and "spot.enabled" in msg
    assert "torchfleet:extra_instance_types" in msg and "mixed instances policy" in msg
    msg = problems(base(settings, "alicloud-prod", warm_pool={"enabled": True}), "alicloud-prod")
    assert "torchfleet:warm_pool" in msg and "except on aws in mode: group" in msg
    msg = problems(
        base(
            settings,
            "aws-prod",
            spot=on_demand,
            extra_instance_types=None,
            warm_pool={"min_size": 20, "max_prepared": 1},
        ),
        "aws-prod",
    )
    assert "torchfleet:warm_pool.min_size = 20" in msg
    assert "torchfleet:warm_pool.max_prepared = 1" in msg


def test_new_keys_join_the_one_pass_report(settings):
    err = problems(
        base(
            settings,
            "aws-prod",
            admin_cidrs=["0.0.0.0/0"],
            boot="fast",
            scaling={"requests_per_node": "lots"},
            warm_pool={"min_size": -1},
            zones=["us-east-1a"] * 2,
        ),
        "aws-prod",
    )
    for key in ("admin_cidrs", "boot", "scaling.requests_per_node", "warm_pool", "zones"):
        assert f"torchfleet:{key}" in err, key


def test_the_docs_table_is_generated_from_the_declaration():
    from pathlib import Path

    from infra.config import FIELDS, KEYS, SUBFIELDS, SUBKEYS, readme_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    start, end = "<!-- config-table:start -->\n", "\n<!-- config-table:end -->"
    assert start in page and end in page
    current = page.split(start, 1)[1].split(end, 1)[0]
    assert current == readme_table(), (
        "docs/configuration.md's table is stale: python -m infra.config --table"
    )
    # one row per declared key and sub-key, and the unknown-key checks use the same declaration
    assert len(current.splitlines()) == len(FIELDS) + len(SUBFIELDS) + 2 and tuple(FIELDS) == KEYS
    assert SUBKEYS["spot"] == FIELDS["spot"].subkeys
    assert "| `spot.max_price_ratio` | number | 1.0 | a number > 0 and <= 1.3 " in current


def test_each_key_is_declared_once_as_a_field_of_its_section():
    """The record's fields and the stack file's keys are one list: every field of StackConfig
    but the three load() does not read from the file is a key's declaration (its type, default,
    doc and parser in one place), every key but `gpu` (instance_type's other spelling, read by
    its parser) fills exactly one field, and a block's sub-keys are its record's fields."""
    from dataclasses import fields

    from infra.config import (
        FIELDS,
        SECTIONS,
        Budget,
        Nodes,
        RolloutSplit,
        Scaling,
        Spot,
        StackConfig,
    )

    record = {f.name for f in fields(StackConfig)} - {"stack", "prices", "fallback_reason"}
    parsed = [decl for decl in FIELDS.values() if decl.parse is not None]
    assert sorted(decl.field for decl in parsed) == sorted(record)
    assert [name for name, decl in FIELDS.items() if decl.parse is None] == ["gpu"]
    declared_in = {
        f.name: section.__name__
        for section in SECTIONS
        for f in fields(section)
        if "key" in f.metadata
    }
    assert set(declared_in) == record  # each in one section, none in StackConfig itself
    assert FIELDS["access"].field == "ssm"
    assert FIELDS["extra_instance_types"].field == "instance_types"
    for name, rec in (
        ("nodes", Nodes),
        ("spot", Spot),
        ("scaling", Scaling),
        ("budget", Budget),
        ("rollout", RolloutSplit),
    ):
        assert FIELDS[name].subkeys == tuple(f.name for f in fields(rec)), name


def test_load_runs_the_parser_its_declaration_names(settings, monkeypatch):
    """load() has no list of parsers of its own: swapping a declaration's parser changes what
    it reads (the field, and the problems the new parser records)."""
    from dataclasses import replace

    from infra.config import FIELDS

    monkeypatch.setitem(FIELDS, "owner", replace(FIELDS["owner"], parse=lambda r, got: "swapped"))
    assert load(base(settings, "aws-prod", owner="team-a"), "aws-prod").owner == "swapped"

    def refuse(r, got):
        r.fail("owner", "team-a", "a test's words")

    monkeypatch.setitem(FIELDS, "owner", replace(FIELDS["owner"], parse=refuse))
    err = problems(base(settings, "aws-prod", owner="team-a"), "aws-prod")
    assert "torchfleet:owner = 'team-a' is invalid; allowed: a test's words" in err


def test_declared_defaults_are_the_ones_load_applies(settings):
    from infra.config import FIELDS

    raw = base(settings)
    for key in ("service_port", "image", "image_distro", "disk_gb", "boot", "vpc_cidr"):
        raw.pop(key, None)
    cfg = load(raw, "aws-dev")
    got = {
        "service_port": cfg.service_port,
        "image": cfg.image,
        "image_distro": cfg.image_distro,
        "disk_gb": cfg.disk_gb,
        "boot": cfg.boot,
        "vpc_cidr": cfg.vpc_cidr,
    }
    assert got == {k: FIELDS[k].default for k in got}


# A value of the wrong YAML kind for each declared kind (a mapping where text belongs reached a
# catalog lookup and crashed with TypeError before the declaration-driven first pass).
WRONG_KIND = {
    "string": {"a": 1},
    "list": 7,
    "mapping": "not a mapping",
    "integer": "many",
    "number": ["1"],
}


@pytest.mark.parametrize("stack", ["aws-prod", "alicloud-dev"])
def test_every_key_of_the_wrong_kind_is_one_error_in_the_declarations_words(settings, stack):
    """Table-driven over FIELDS: each key set to a value of the wrong kind is refused with one
    problem naming the key and quoting its declared kind and `allowed` (the docs' words), and
    nothing else is reported for it; no key crashes the loader."""
    from infra.config import FIELDS

    assert set(WRONG_KIND) >= {decl.kind for decl in FIELDS.values()}
    for key, decl in FIELDS.items():
        bad = WRONG_KIND[decl.kind]
        with pytest.raises(ConfigError) as err:
            load(base(settings, stack, **{key: bad}), stack)
        mine = [p for p in err.value.problems if p.startswith(f"torchfleet:{key} ")]
        assert mine == [
            f"torchfleet:{key} = {bad!r} is invalid; allowed: a YAML {decl.kind}: {decl.allowed}"
        ], (key, err.value.problems)


def test_pulumi_text_forms_of_structured_and_numeric_keys_pass_the_kind_check(settings):
    """Pulumi hands structured values over as JSON text and numbers as text: of the right kind."""
    raw = base(settings, "aws-prod")
    raw["zones"] = json.dumps(raw["zones"])
    raw["nodes"] = json.dumps(raw["nodes"])
    raw["service_port"] = "8080"
    cfg = load(raw, "aws-prod")
    assert cfg.service_port == 8080
    assert list(cfg.zones) == json.loads(raw["zones"])


def test_checks_without_words_of_their_own_quote_the_declaration(settings):
    from infra.config import FIELDS

    for key, value in (
        ("owner", "has spaces"),
        ("model_bucket", "Upper_Case"),
        ("image", "not-an-ami"),
        ("service_port", 80),
    ):
        err = problems(base(settings, "aws-prod", **{key: value}), "aws-prod")
        assert f"torchfleet:{key} = {value!r} is invalid; allowed: {FIELDS[key].allowed}" in err


def test_a_sub_key_is_read_by_its_declaration(settings, monkeypatch):
    """A block's sub-keys have no reader, default or allowed words of their own in the block's
    parser: each comes from the record field's `sub(...)` declaration (the generic block
    reader applies them), so changing the declaration changes what load() does."""
    from dataclasses import fields, replace

    from infra.config import FIELDS, SUBFIELDS, Scaling, Spot
    from infra.schedule import Schedule

    # schedule's record lives below infra/config: its declarations are the same list of fields
    assert FIELDS["schedule"].subkeys == tuple(f.name for f in fields(Schedule))

    declared = {f.name: f.metadata["key"] for f in fields(Spot)}
    assert SUBFIELDS["spot.max_price_ratio"].allowed == declared["max_price_ratio"].allowed
    raw = base(settings, spot={"enabled": True, "interruption": "stop"})
    assert load(raw, "aws-dev").spot.max_price_ratio == declared["max_price_ratio"].default
    # every declared default lands in the record when the block leaves the sub-key unset
    spot = load(raw, "aws-dev").spot
    assert spot.fallback == declared["fallback"].default and spot.on_demand_base == 0
    cfg = load(base(settings, "aws-prod", scaling={"requests_per_node": 600}), "aws-prod")
    for f in fields(Scaling):
        decl = f.metadata["key"]
        if not callable(decl.default) and decl.default is not REQUIRED:
            assert getattr(cfg.scaling, f.name) == decl.default, f.name
    # swap the declaration's reader and default: load() follows
    field = next(f for f in fields(Spot) if f.name == "max_price_ratio")
    swapped = replace(
        field.metadata["key"], default=0.7, read=lambda r, path, value, got: value / 2
    )
    monkeypatch.setattr(field, "metadata", {"key": swapped})
    assert load(raw, "aws-dev").spot.max_price_ratio == 0.35

    def refuse(r, path, value, got):
        r.fail(path, value)

    monkeypatch.setattr(field, "metadata", {"key": replace(swapped, read=refuse)})
    err = problems(raw)
    assert "torchfleet:spot.max_price_ratio = 0.7 is invalid; allowed: a number > 0" in err
