"""Facts the READMEs state about the code are the code's: the runtime's settings table (keys and
defaults) is the settings contract, the Makefile-targets table lists the Makefile's targets, an
image a page says how to remake is the image it shows, and the shell scripts a user runs from
anywhere find their files and set no variable they never read."""

from __future__ import annotations

import re

from commands import makefile, shell_scripts
from docs_support import DOCS, REPO, table


def test_the_runtime_settings_table_is_the_settings_contract():
    from torchfleet_compat.runtime_settings import FIELDS, defaults

    rows = table((REPO / "runtime" / "README.md").read_text(), "key")
    values = defaults()
    documented: set[str] = set()

    def shown(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    for row in rows:
        keys = [k.strip() for k in row[0].split(",")]
        cells = [c.strip() for c in row[1].split(",")]
        for i, key in enumerate(keys):
            assert key in FIELDS, f"runtime/README.md: no runtime setting {key!r}"
            documented.add(key)
            default = values[key]
            if default is None or len(cells) != len(keys):
                continue  # none, or derived: said in words ("from metadata", "—")
            cell = cells[i]
            if cell == "auto" and key in (
                "max_batch_size",
                "torch_threads",
                "torch_interop_threads",
            ):
                continue  # None in the record, decided at start-up
            assert cell == shown(default), (
                f"runtime/README.md: {key} defaults to {shown(default)!r}, not {cell!r}"
            )
    text = (REPO / "runtime" / "README.md").read_text()
    missing = [k for k in FIELDS if k not in documented and f"`{k}`" not in text]
    assert not missing, f"runtime/README.md documents no setting {missing}"


def test_the_make_targets_table_is_the_makefiles_targets():
    page = DOCS / "development" / "tests.md"
    rows = table(page.read_text(), "target")
    listed = {t for r in rows for t in re.findall(r"`make ([a-z][\w-]*)", r[0])}
    targets = makefile()[0]
    assert listed == targets - {"clean"}, (
        f"{page.relative_to(REPO)}: listed {sorted(listed)}, the Makefile has {sorted(targets)}"
    )
    # a target that writes a Pulumi config value (`pulumi up --config`) says it writes the stack
    make_text = (REPO / "Makefile").read_text()
    for target, recipe in re.findall(r"^([a-z][\w-]*):.*\n((?:\t.*\n)+)", make_text, re.M):
        if re.search(r"pulumi up\b.*--config", recipe):
            (row,) = [r for r in rows if f"`make {target}" in r[0]]
            assert "writes" in row[1] and "Pulumi.<stack>.yaml" in row[1], (
                f"{page.relative_to(REPO)}: make {target} runs `pulumi up --config`, which "
                "writes the value into the stack file; its row must say so"
            )


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
WRITES_PNG = re.compile(r"\b[A-Z_]*PNG=(\S+)")


def test_a_page_remakes_the_image_it_shows():
    pages = [*sorted(DOCS.rglob("*.md")), REPO / "README.md"]
    checked = 0
    for page in pages:
        text = page.read_text()
        shown = {(page.parent / src).resolve() for src in IMAGE.findall(text)}
        for written in WRITES_PNG.findall(text):
            checked += 1
            assert (REPO / written).resolve() in shown, (
                f"{page.relative_to(REPO)}: remakes {written}, which is not an image it shows "
                f"({sorted(str(p.relative_to(REPO)) for p in shown)})"
            )
    assert checked, "no page remakes an image: is the pattern still finding them?"


SCRIPTS = shell_scripts()
# a shell variable set on a line of its own (`NAME=value CMD` sets the command's environment, and
# an exported name is read by the processes it starts)
ASSIGNED = re.compile(
    r"^\s*(?:local\s+|readonly\s+)?([A-Za-z_]\w*)=(?:\"[^\"]*\"|'[^']*'|\$\([^)]*\)|\S*)\s*$", re.M
)


def script_problems(text: str, name: str) -> list[str]:
    """A script that names repository paths relative to the root (`.venv/...`) changes to the
    root first; a variable it assigns is read somewhere in it."""
    problems = []
    code = "\n".join(
        line.split(" #", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("#")
    )
    if re.search(r"(?<![\w/$.])\.venv/", code) and not re.search(
        r'^cd "\$\(dirname "\$0"\)[/.]*"', text, re.M
    ):
        problems.append(f"{name}: uses .venv/ relative to the root without cd to it")
    for var in sorted(set(ASSIGNED.findall(code))):
        rest = re.sub(rf"^\s*(?:local\s+|readonly\s+)?{var}=.*$", "", code, flags=re.M)
        if not re.search(rf"\${var}\b|\${{[#!]?{var}\b|\b{var}\b", rest):
            problems.append(f"{name}: {var} is set and never read")
    return problems


def test_every_script_runs_from_any_directory_and_reads_what_it_sets():
    problems = [
        p for s in SCRIPTS for p in script_problems(s.read_text(), str(s.relative_to(REPO)))
    ]
    assert len(SCRIPTS) > 5 and not problems, "\n".join(problems)


def test_the_script_check_finds_a_planted_unused_variable_and_a_root_relative_path():
    planted = '#!/bin/bash\nset -eu\nUNUSED=${UNUSED:-1}\nPY=.venv/bin/python\n"$PY" -V\n'
    assert script_problems(planted, "x.sh") == [
        "x.sh: uses .venv/ relative to the root without cd to it",
        "x.sh: UNUSED is set and never read",
    ]
    fixed = planted.replace("set -eu\n", 'set -eu\ncd "$(dirname "$0")/.."\n')
    assert script_problems(fixed.replace("UNUSED=${UNUSED:-1}\n", ""), "x.sh") == []


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4}


def test_an_example_stacks_comment_counts_its_zones_as_its_config_lists_them():
    """`… across two zones` in an example stack's comment is its `torchfleet:zones` list."""
    import yaml

    checked = 0
    for path in sorted(REPO.glob("Pulumi.*.yaml")):
        text = path.read_text()
        zones = (yaml.safe_load(text).get("config") or {}).get("torchfleet:zones")
        comments = " ".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
        for word in re.findall(r"\b(one|two|three|four)\s+zones?\b", comments):
            checked += 1
            assert zones is not None and NUMBERS[word] == len(zones), (
                f"{path.name}: its comment says {word} zones, torchfleet:zones lists {zones}"
            )
    assert checked >= 2, "no example counts its zones: is the pattern still finding them?"
