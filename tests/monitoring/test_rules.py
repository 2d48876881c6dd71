"""The role's recording and alert rules under Debian's promtool: they parse (`check rules`),
every unit test in tests/monitoring/rules/ passes (`test rules`), every alert has at least
one firing and one not-firing case there, and every alert links its own runbook section."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify
from monitoring_support import RULE_FILES, need, promtool_test

TESTS_DIR = Path(__file__).resolve().parent / "rules"
TEST_FILES = sorted(TESTS_DIR.glob("*.test.yml"))


def _alerts() -> set[str]:
    names = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(r["alert"] for r in group["rules"] if "alert" in r)
    return names


def test_rule_files_pass_promtool_check() -> None:
    assert RULE_FILES, "no rule files found"
    done = subprocess.run(
        [need("promtool"), "check", "rules", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_FILES), done.stdout


@pytest.mark.parametrize("test_file", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    promtool_test(test_file)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases: dict[str, set[str]] = defaultdict(set)
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        loaded = {Path(f).name for f in doc["rule_files"]}
        if any("alert_rule_test" in t for t in doc["tests"]):
            assert loaded >= {p.name for p in RULE_FILES}, (
                f"{path.name} does not load every rule file"
            )
        for test in doc["tests"]:
            for check in test.get("alert_rule_test", []):
                cases[check["alertname"]].add("firing" if check.get("exp_alerts") else "not firing")
    alerts = _alerts()
    assert len(alerts) >= 10, alerts
    unknown = set(cases) - alerts
    assert not unknown, f"tests name alerts the rules do not define: {sorted(unknown)}"
    missing = {
        a: sorted({"firing", "not firing"} - cases[a])
        for a in alerts
        if cases[a] != {"firing", "not firing"}
    }
    assert not missing, f"alerts without a firing or a not-firing case: {missing}"


def test_alerts_carry_a_known_severity_and_a_summary() -> None:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["labels"]["severity"] in ("page", "ticket", "info"), rule["alert"]
                    assert rule["annotations"]["summary"], rule["alert"]


def test_every_alert_links_its_own_runbook_section() -> None:
    repo = Path(__file__).resolve().parents[2]
    page = (repo / "docs" / "runbooks.md").read_text()
    sections = {
        slugify(line[3:].strip(), "-") for line in page.splitlines() if line.startswith("## ")
    }
    linked = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    linked[rule["alert"]] = rule["annotations"].get("runbook_url", "")
    assert len(linked) >= 10
    for alert, url in linked.items():
        assert url == f"docs/runbooks.md#{slugify(alert, '-')}", (alert, url)
        assert url.split("#", 1)[1] in sections, f"{alert}: no section {url} in docs/runbooks.md"
    assert sections == {slugify(a, "-") for a in linked}, "runbook sections without an alert"


def test_diagnose_finds_what_the_alerts_fire_on() -> None:
    # `torchfleet-runtime diagnose` runs on a node without the rule files: its thresholds are
    # copies, held equal here.
    from torchfleet_runtime import diagnose

    exprs = {
        rule["alert"]: rule["expr"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert (
        exprs["TorchfleetGpuMemoryFragmented"].strip().endswith(f"> {diagnose.FRAGMENTATION_RATIO}")
    )
    assert f"+ {diagnose.SIZING_MARGIN})" in exprs["TorchfleetGpuMemoryAboveSizing"]
