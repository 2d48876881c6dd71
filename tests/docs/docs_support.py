"""What the docs tests share: where the pages are, and how to read their marked sections and
tables.

The README and every page under docs/ are "the docs". A page marks text that a test keeps equal
to the code with `<!-- NAME:start -->` / `<!-- NAME:end -->` lines."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def readmes() -> list[Path]:
    """The READMEs beside the code, which users read as docs too."""
    beside = [REPO / "runtime" / "README.md", REPO / "benchmarks" / "README.md"]
    roles = sorted(role / "README.md" for role in (REPO / "roles").iterdir())
    return [*beside, *(r for r in roles if r.is_file())]


def section(page: Path, name: str) -> str:
    """The text between a page's `<!-- NAME:start -->` and `<!-- NAME:end -->` lines."""
    text = page.read_text()
    start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
    assert start in text and end in text, f"{page.relative_to(REPO)} has no section {name!r}"
    return text.split(start, 1)[1].split(end, 1)[0]


def table(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose first header cell is `first_header`, as cells
    (stripped, escaped pipes kept as `\\|`)."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").replace("\\|", "\0").split("|")]
        cells = [c.replace("\0", "\\|") for c in cells]
        if not inside:
            inside = cells[0] == first_header
            continue
        if set(cells[0]) <= {"-", ":", " "}:
            continue
        rows.append(cells)
    assert rows, f"no table headed {first_header!r}"
    return rows
