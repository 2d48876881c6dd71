"""What the docs say about the code is what the code does: the stage numbers every transcript
shows, the stage and exit-code tables, the transcript of a run that stops in its preflight, the
runtime's routes and metric names, and the version matrix's tables.

Each test reads the fact from the code (or runs it) and fails naming the page to fix."""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
from pathlib import Path

import yaml
from docs_support import DOCS, REPO, pages, section, table

from infra.deploy import demo, pipeline, stage

# `[4/6] converge`, and a bare `[2/9]` in prose: every header a page shows, named or not
HEADER = re.compile(r"\[(\d+)/(\d+)\](?: ([a-z]+))?")


def steps_of(function) -> list[str]:
    """The stage names a job prints, in order, read from its code: each `steps("name", …)`,
    `_preflight(…)` (the preflight stage) and `node_stages(…)` (the node stages, instances
    mode) it calls."""
    tree = ast.parse(inspect.getsource(function).lstrip())
    calls = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    names: list[str] = []
    for call in calls:
        if call.func.id == "steps" and isinstance(call.args[0], ast.Constant):
            names.append(call.args[0].value)
        elif call.func.id == "_preflight":
            names.append("preflight")
        elif call.func.id == "node_stages":
            names += steps_of(pipeline.node_stages)
    return names


JOBS = {
    "up": steps_of(pipeline.up),
    "down": steps_of(pipeline.down),
    "status": steps_of(pipeline.status),
    "demo": steps_of(demo._run),
}


def test_up_runs_the_stages_that_carry_exit_codes_in_their_order():
    assert JOBS["up"] == list(stage.STAGES)
    assert JOBS["demo"][1:5] == JOBS["up"][2:]  # the demo runs up's node stages
    for job in ("down", "status"):
        assert JOBS[job][0] == "preflight" and len(JOBS[job]) >= 2


def test_every_stage_header_in_the_docs_is_numbered_as_its_job_numbers_it():
    by_total = {len(names): (job, names) for job, names in JOBS.items()}
    assert len(by_total) == len(JOBS), "two jobs with as many stages: headers are ambiguous"
    shown = 0
    for page in pages():
        for number, total, name in HEADER.findall(page.read_text()):
            job, names = by_total.get(int(total), (None, []))
            where = f"{page.relative_to(REPO)}: [{number}/{total}] {name}"
            assert job, f"{where}: no job runs {total} stages ({JOBS})"
            assert 1 <= int(number) <= len(names), f"{where}: {job} numbers {names}"
            if name:
                assert names[int(number) - 1] == name, f"{where}: {job} numbers {names}"
            shown += 1
    assert shown >= 5


def test_the_stage_table_is_ups_stages_with_their_exit_codes():
    rows = table((DOCS / "deploy" / "stages.md").read_text(), "stage")
    assert [(r[0], int(r[1])) for r in rows] == [
        (f"{n} {name}", code) for n, (name, code) in enumerate(stage.STAGES.items(), 1)
    ]
    demo_rows = table((DOCS / "quickstart.md").read_text(), "stage")
    assert [r[0] for r in demo_rows] == [f"{n} {name}" for n, name in enumerate(JOBS["demo"], 1)]


def test_the_exit_code_table_is_the_codes_the_cli_exits_with():
    rows = table((DOCS / "deploy" / "exit-codes.md").read_text(), "code")
    codes = {int(r[0]): r[1] for r in rows}
    assert codes == {
        stage.EXIT_OK: "success",
        stage.EXIT_BUG: "bug",
        stage.EXIT_USAGE: "usage",
        **{code: name for name, code in stage.STAGES.items()},
        stage.EXIT_REFUSED: "refused",
        stage.EXIT_ROLLED_BACK: "rolled back",
        stage.EXIT_INTERRUPTED: "interrupted",
    }
    # the stages outside `up` are named in the row of the code they exit with
    text = {int(r[0]): " ".join(r) for r in rows}
    for name, code in stage.OTHER_STAGES.items():
        assert name in text[code], f"exit code {code}'s row does not mention stage {name!r}"


def test_the_preflight_transcript_is_what_up_prints_on_a_bare_machine(
    tmp_path, monkeypatch, capsys
):
    """Run `torchfleet up aws-dev` as the page says: no cloud credentials, no Pulumi CLI, and a
    home directory with no SSH key (/home/you, which must not exist); compare all but the time."""
    from infra import cli

    home = Path("/home/you")
    assert not home.exists(), f"{home} exists here: the transcript's home must be empty"
    for key in list(os.environ):
        if key.startswith(("AWS_", "ALICLOUD_", "ALIBABA_CLOUD_", "PULUMI_", "SSH_AUTH_SOCK")):
            monkeypatch.delenv(key)
    # a bare machine: the reference prices because no credentials, whatever mode another test
    # directory's conftest pinned for its own process
    monkeypatch.delenv("TORCHFLEET_PRICES", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setattr(pipeline, "RUNS", tmp_path / "runs")  # its run log, out of the checkout
    rc = cli.main(["up", "aws-dev"])
    expected = f"$ torchfleet up aws-dev\n{capsys.readouterr().out}$ echo $?\n{rc}\n"
    shown = section(DOCS / "deploy" / "stages.md", "transcript:up-preflight")
    shown = shown.removeprefix("```\n").removesuffix("\n```") + "\n"

    def timeless(text: str) -> str:
        return re.sub(r"after \d+(\.\d+)? s", "after N s", text)

    assert rc == stage.STAGES["preflight"]
    assert timeless(shown) == timeless(expected), f"docs/deploy/stages.md should show:\n{expected}"


def test_the_runtime_routes_in_the_contract_are_the_servers():
    from torchfleet_runtime import server

    rows = table((DOCS / "contracts" / "runtime-api.md").read_text(), "route")
    documented = {r[0].strip("`"): tuple(m.strip() for m in r[1].split(",")) for r in rows}
    assert documented == server.ROUTES


def test_the_metrics_the_contract_names_are_the_runtimes():
    import torchfleet_runtime

    source = "\n".join(p.read_text() for p in Path(torchfleet_runtime.__file__).parent.glob("*.py"))
    rows = table((DOCS / "contracts" / "runtime-api.md").read_text(), "metric")
    for row in rows:
        name = row[0].strip("`")
        registered = re.sub(r"_total$", "", name)  # prometheus_client adds _total to counters
        assert f'"{registered}"' in source, f"the runtime registers no metric {name}"


def test_the_version_tables_are_the_matrix():
    matrix = yaml.safe_load((REPO / "compat" / "matrix.yml").read_text())
    page = DOCS / "contracts" / "versions.md"

    def cell(value) -> str:
        if value is None:
            return "—"
        return ", ".join(value) if isinstance(value, list) else str(value)

    def render(header: list[str], rows: list[list]) -> str:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])

    keys = ("cuda", "toolkit_version", "min_driver", "torch", "torchvision", "pythons")
    expected = {
        "matrix-profiles": render(
            ["profile", "CUDA", "toolkit", "min driver", "torch", "torchvision", "Pythons"]
            + ["max compute capability"],
            [
                [f"`{name}`", *(p[k] for k in keys), p["max_compute_capability"]]
                for name, p in matrix["profiles"].items()
            ],
        ),
        "matrix-gpus": render(
            ["GPU", "compute capability", "architecture", "memory (GiB)"],
            [
                [name, g["compute_capability"], g["arch"], g["memory_gib"]]
                for name, g in matrix["gpus"].items()
            ],
        ),
        "matrix-distros": render(
            ["distro", "Python", "CUDA repository", "driver from", "standard support until"],
            [
                [name, d["python"], d["cuda_repo"], d["driver_source"], d["standard_support_until"]]
                for name, d in matrix["distros"].items()
            ],
        ),
    }
    for name, text in expected.items():
        assert section(page, name) == text, f"{page.relative_to(REPO)}, {name}, should be:\n{text}"
    assert f"`{matrix['default_profile']}` (`default_profile`)" in page.read_text()


def test_the_clis_exit_code_epilog_is_the_codes_it_exits_with():
    """`torchfleet --help` lists the exit codes (infra/cli.py's epilog, and so the generated
    reference page): each of up's stages, and the codes outside them, by number and name."""
    from infra import cli

    named = {
        **{code: name for name, code in stage.STAGES.items()},
        stage.EXIT_OK: "success",
        stage.EXIT_BUG: "unexpected error",
        stage.EXIT_USAGE: "usage",
        stage.EXIT_REFUSED: "refused",
        stage.EXIT_ROLLED_BACK: "rollout",
        stage.EXIT_INTERRUPTED: "interrupted",
    }
    listed = {
        int(code): text
        for code, text in re.findall(r"(?:^|\s)(\d+) ([a-z]+(?: [a-z]+)*)", cli.EPILOG)
    }
    assert set(listed) == set(named), f"infra/cli.py's epilog lists codes {sorted(listed)}"
    for code, name in named.items():
        assert listed[code].startswith(name), f"infra/cli.py's epilog: {code} {listed[code]!r}"
