"""Every example stack's node distro is one a container test converges, and none is past its
standard support: the distro a user copies from an example is a converged path, and `plan` does
not greet the examples with a warning. A Kubernetes example's nodes run the runtime image, so
there the image's base distro (scripts/build_runtime_image.py's default for the stack's profile)
is the one judged. The clock is the real one against the support table (compat/matrix.yml's
`standard_support_until`): a distro leaving support fails these tests the day after, and warns
from NOTICE_DAYS before. Fails too when an example names a distro no scenario converges (or a
scenario stops converging the one it names), and when the defaults a stack gets by setting
nothing neither converge nor are refused naming the key to set."""

from __future__ import annotations

import datetime
import importlib.util
import re
import warnings
from pathlib import Path

import pytest
import yaml
from torchfleet_compat import matrix as compat

from infra.config import FIELDS, ConfigError, distro_warning, load, raw_from_pulumi_config
from infra.matrix import load_matrix
from infra.plan import ALL_STACKS, load_stack_config

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "roles" / "molecule"
# Debian's suite names, as the container images are named (scripts/build_image.sh builds them).
SUITES = {"bookworm": "debian-12", "bullseye": "debian-11"}
TODAY = datetime.date.today()
NOTICE_DAYS = 90  # warn this long before a distro an example runs leaves standard support


def support_left(distro: str) -> None:
    """Fail when `distro` is past its standard support today (the matrix's rule); warn when it
    will be in NOTICE_DAYS."""
    now = compat.support_verdict(load_matrix(), distro, TODAY.isoformat())
    assert now.ok, f"{now.reason} (compat/matrix.yml); supported: {', '.join(now.distros)}"
    ahead = TODAY + datetime.timedelta(days=NOTICE_DAYS)
    soon = compat.support_verdict(load_matrix(), distro, ahead.isoformat())
    if not soon.ok:
        warnings.warn(
            f"within {NOTICE_DAYS} days (on {ahead}): {soon.reason}; move the examples (and the "
            "runtime image's base) to "
            f"one of {', '.join(soon.distros)}",
            stacklevel=2,
        )


def build_script():
    spec = importlib.util.spec_from_file_location(
        "build_runtime_image", REPO / "scripts" / "build_runtime_image.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def converged() -> dict[str, list[str]]:
    """distro -> the Molecule scenarios that converge site.yml on it."""
    out: dict[str, list[str]] = {}
    for path in sorted(SCENARIOS.glob("*/molecule.yml")):
        doc = yaml.safe_load(path.read_text())
        if not doc["provisioner"]["playbooks"]["converge"].endswith("playbooks/site.yml"):
            continue  # the monitoring scenario converges the monitoring host, not a node
        for platform in doc["platforms"]:
            suite = platform["image"].removeprefix("localhost/torchfleet-").split(":")[0]
            out.setdefault(SUITES[suite], []).append(path.parent.name)
    return out


def test_the_scenarios_converge_both_debian_releases():
    assert converged() == {"debian-12": ["site"], "debian-11": ["legacy"]}


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_every_example_runs_a_converged_distro_within_support(stack):
    cfg = load(raw_from_pulumi_config(load_stack_config(stack)), stack)
    if cfg.mode == "kubernetes":
        # its nodes run the runtime image: the image's base distro is the one in support
        base = build_script().default_base(load_matrix(), cfg.cuda_profile, TODAY.isoformat())
        release = re.search(r"ubuntu:?-?(\d\d\.\d\d)|debian:(\d+)", base)
        assert release, f"{stack}: the runtime image's base {base} names no known distro"
        support_left(f"ubuntu-{release[1]}" if release[1] else f"debian-{release[2]}")
        return
    scenarios = converged().get(cfg.image_distro)
    assert scenarios, (
        f"Pulumi.{stack}.yaml: torchfleet:image_distro = {cfg.image_distro} is converged by no "
        f"scenario under {SCENARIOS.relative_to(REPO)} (converged: {sorted(converged())})"
    )
    assert distro_warning(cfg, TODAY.isoformat()) is None, distro_warning(cfg, TODAY.isoformat())
    support_left(cfg.image_distro)


def test_the_default_distro_is_converged_and_a_default_profile_that_does_not_fit_is_refused():
    """A stack that sets neither image_distro nor cuda_profile gets a distro a scenario
    converges, and, where the matrix's default profile cannot serve that distro, a refusal at
    load (before anything is registered: plan and up both load first) naming the one key to
    set and the profiles that fit."""
    assert FIELDS["image_distro"].default in converged()
    support_left(FIELDS["image_distro"].default)
    values = load_stack_config("aws-dev")
    values.pop("torchfleet:image_distro")
    values.pop("torchfleet:cuda_profile")
    with pytest.raises(ConfigError) as err:
        load(raw_from_pulumi_config(values), "aws-dev")
    (problem,) = err.value.problems
    assert problem.startswith("torchfleet:cuda_profile = None is invalid; allowed: set it: ")
    assert "profiles that fit: cu118, cu121" in problem
    # what the example sets instead is one of them, and loads
    values["torchfleet:cuda_profile"] = "cu121"
    assert load(raw_from_pulumi_config(values), "aws-dev").image_distro == "debian-12"


def test_plan_and_preflight_warn_about_a_distro_past_its_support(tmp_path, capsys):
    """Ubuntu 20.04 (standard support ended 2025-05-31) still plans, with a warning; the
    preflight reports it as a note that does not stop `up`."""
    from infra import plan
    from infra.deploy.preflight import check_distro

    values = load_stack_config("aws-dev")
    values["torchfleet:image_distro"] = "ubuntu-20.04"
    path = tmp_path / "Pulumi.aws-dev.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    assert plan.main(["aws-dev", "--config", str(path)]) == 0
    warnings = capsys.readouterr().out.split("\nWARNINGS\n", 1)[1]
    assert "aws-dev: torchfleet:image_distro = ubuntu-20.04: " in warnings
    assert "2025-05-31" in warnings and "debian-12" in warnings
    cfg = load(raw_from_pulumi_config(values), "aws-dev")
    check = check_distro(cfg, TODAY.isoformat())
    assert check is not None and not check.ok and not check.required
