"""The preflight and `torchfleet-runtime check` agree by construction: one probe, one judge.

Both entry points are wrappers around torchfleet_compat.judge.judge over a probe.NodeFacts; the
only difference is the stage (`Options.installed`), which may turn a broken rule's failure into a
warning on an installed node (the torch that imports is the better witness) but never changes a
rule's verdict. These tests judge the same facts at both stages and compare.
"""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path

import pytest
import yaml
from torchfleet_compat import check, judge, preflight, probe
from torchfleet_compat import matrix as compat
from torchfleet_compat.judge import FAIL, OK, WARN, Options
from torchfleet_compat.probe import Disk, Gpu, Kernel, NodeFacts

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "compat/matrix.yml").read_text())
MATRIX = compat.parse(RAW)
RULES = (compat.DISTRO, compat.PYTHON, compat.GPU, compat.DISK)
TODAY = "2026-12-02"  # ubuntu-20.04 and debian-11 are past their standard support, the others not


def test_both_entry_points_call_the_same_probe_and_judge():
    assert preflight.judge is check.judge is judge.judge
    assert preflight.probe is check.probe is probe.probe


def facts_for(gpu: str | None, distro: str, python: str, free_gb: float) -> NodeFacts:
    """One node as the probe sees it: a GPU on the bus named by lspci (or none)."""
    pci = [Gpu(0, gpu, None, gpu, "lspci", device_id="0x1234")] if gpu else []
    return NodeFacts(
        python_version=python,
        distro=distro,
        disk=Disk("/opt", "/opt", int(free_gb * 1e9)),
        pci=pci,
        lspci_available=True,
        kernel=Kernel("6.1.0", "/x", True),
        torch_version=None,
    )


def verdicts(checks: list[judge.Check]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for c in checks:
        if c.rule in RULES and c.verdict is not None:
            out.setdefault(c.rule, []).append(c.verdict.ok)
    return out


CELLS = list(
    itertools.product(
        [*RAW["gpus"], None, "Unknown GPU"],
        RAW["profiles"],
        [*RAW["distros"], "debian-10"],
        ["3.7.3", "3.9.2", "3.11.2", "3.14.0"],
        [1.0, 100.0],
    )
)


@pytest.mark.parametrize("profile", RAW["profiles"])
def test_a_rule_has_one_verdict_before_and_after_install(profile):
    seen_statuses = set()
    for gpu, prof, distro, python, free in CELLS:
        if prof != profile:
            continue
        facts = facts_for(gpu, distro, python, free)
        _, before = judge.judge(facts, MATRIX, Options(profile=prof, installed=False, today=TODAY))
        _, after = judge.judge(facts, MATRIX, Options(profile=prof, today=TODAY))
        assert verdicts(before) == verdicts(after), (gpu, prof, distro, python, free)
        # and a status differs only where an installed node has the better witness: a fail
        # before install may be a warning after it, never the other way round, never an ok
        after_by_name = {c.name: c for c in after}
        for c in before:
            if c.rule in RULES and c.name in after_by_name:
                pair = (c.status, after_by_name[c.name].status)
                seen_statuses.add(pair)
                assert pair in {(OK, OK), (FAIL, FAIL), (FAIL, WARN)}, (c, after_by_name[c.name])
            # a distro past its standard support warns at both stages (rule `support`)
            if c.rule == compat.SUPPORT:
                assert (c.status, after_by_name[c.name].status) == (WARN, WARN)
                seen_statuses.add("support")
    # the table exercises all three, and the support warning
    assert seen_statuses == {(OK, OK), (FAIL, FAIL), (FAIL, WARN), "support"}


def test_the_preflight_refuses_exactly_the_rows_the_judge_fails():
    facts = facts_for("H100", "debian-12", "3.11.2", 1.0)
    params = {k: v.get("default") for k, v in preflight.ARGUMENTS.items()}
    params.update(profile="cu116", gpu_model="H100")
    result = preflight.result(MATRIX, facts, params)
    _, checks = judge.judge(facts, MATRIX, preflight.options(params))
    failed = [c for c in checks if c.status == FAIL]
    assert [c.rule for c in failed] == [compat.PYTHON, compat.GPU, compat.DISK]
    assert len(result["problems"]) == len(failed) and result["refused"] is True
    # each problem starts with the rule's own reason, then names the role variable to change
    for problem, row in zip(result["problems"], failed, strict=True):
        assert problem.startswith(row.verdict.reason)
    assert "set torchfleet_cuda_profile to cu118 or cu121" in result["problems"][1]
    assert "lower preflight_min_free_disk_gb" in result["problems"][2]
    # a waived rule is reported, not refused
    waived = dict(params, check_python=False, check_gpu=False)
    assert len(preflight.result(MATRIX, facts, waived)["problems"]) == 1


def test_the_preflight_warns_about_a_distro_past_its_standard_support():
    # ubuntu-20.04's standard support ended on 2025-05-31: past it on any later clock
    facts = facts_for("A10G", "ubuntu-20.04", "3.8.10", 100.0)
    params = {k: v.get("default") for k, v in preflight.ARGUMENTS.items()}
    params.update(profile="cu116", gpu_model="A10G")
    result = preflight.result(MATRIX, facts, params)
    assert result["refused"] is False and result["problems"] == []
    today = datetime.date.today().isoformat()
    supported = [n for n, d in RAW["distros"].items() if d["standard_support_until"] >= today]
    assert "debian-12" in supported and "ubuntu-20.04" not in supported
    assert result["warnings"] == [
        "distro ubuntu-20.04: ubuntu-20.04's standard support ended on 2025-05-31 (no free "
        f"security updates since): use distro {' or '.join(supported)}"
    ]
