"""Every example stack's node distro is one a container test converges, and none is past its
standard support: the distro a user copies from an example is a converged path, and `plan` does
not greet the examples with a warning. Fails when an example names a distro no scenario
converges (or a scenario stops converging the one it names)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config import distro_warning, load, raw_from_pulumi_config
from infra.plan import ALL_STACKS, load_stack_config

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "roles" / "molecule"
# Debian's suite names, as the container images are named (scripts/build_image.sh builds them).
SUITES = {"bookworm": "debian-12", "bullseye": "debian-11"}
TODAY = "2026-12-02"  # the day this was checked; the pinned date keeps the test reproducible


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
        assert distro_warning(cfg, TODAY) is None  # its nodes run the runtime image
        return
    scenarios = converged().get(cfg.image_distro)
    assert scenarios, (
        f"Pulumi.{stack}.yaml: torchfleet:image_distro = {cfg.image_distro} is converged by no "
        f"scenario under {SCENARIOS.relative_to(REPO)} (converged: {sorted(converged())})"
    )
    assert distro_warning(cfg, TODAY) is None, distro_warning(cfg, TODAY)


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
    check = check_distro(cfg, TODAY)
    assert check is not None and not check.ok and not check.required
