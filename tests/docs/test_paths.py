"""Every repository path the docs cite exists, the docs cite no file outside the repository, and
every Markdown file the code cites exists.

A cited path is any token that starts at one of the repository's top-level entries (`infra/…`,
`roles/<role>/…`, `Pulumi.<cloud>-<env>.yaml`, `CHANGELOG.md`), in prose, tables, code blocks
or links, and every `python -m MODULE`. A `<placeholder>` matches any one name; a path that git
ignores (a generated file: `inventories/<stack>/stack.yml`, `.cache/…`) counts as cited
correctly without existing."""

from __future__ import annotations

import re
import subprocess

from docs_support import DOCS, README, REPO, pages, readmes

# Where a citation may start: the repository's top-level folders and files (what git tracks at
# the root), and .cache/ (generated, git-ignored).
TRACKED = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    cwd=REPO,
    check=True,
    capture_output=True,
    text=True,
).stdout.splitlines()
FOLDERS = sorted({f.split("/", 1)[0] for f in TRACKED if "/" in f} | {".cache"})
FILES = sorted(f for f in TRACKED if "/" not in f and not f.startswith("."))
PATH = re.compile(
    r"(?<![\w./~<>$-])("
    + r"(?:"
    + "|".join(map(re.escape, FOLDERS))
    + r")/[\w./<>@-]*"
    + r"|(?:"
    + "|".join(map(re.escape, FILES))
    + r"|Pulumi\.[\w<>-]+\.yaml)(?![\w/-])"
    + r")"
)
MODULE = re.compile(r"python3? -m ([a-z_][\w.]*)")
# A Markdown file named in code: a bare name (README.md) or a path; not another project's
# ("TorchServe's docs/…").
MARKDOWN = re.compile(r"(?<![\w./<>-])(?<!'s\s)([\w./<>-]*[\w>]\.md)(?![\w-])")
# Text that names a file outside the repository (a design note, a contract kept elsewhere).
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bCONTRACT-[\w-]+\.md\b")


def cited(text: str) -> set[str]:
    paths = {m.rstrip(".,:;)") for m in PATH.findall(text)}
    modules = {m.replace(".", "/") + ".py" for m in MODULE.findall(text)}
    return {p for p in paths if p} | {m for m in modules if m.split("/")[0] in FOLDERS}


def exists(path: str) -> bool:
    if "<" in path or "*" in path:
        pattern = re.sub(r"<[^>/]*>", "*", path).rstrip("/")
        return any(REPO.glob(pattern)) or ignored(path)
    target = REPO / path
    if target.exists() or ignored(path):
        return True
    # `python -m pkg.module`: a package's __main__ also counts
    return path.endswith(".py") and (REPO / path[:-3] / "__main__.py").exists()


def ignored(path: str) -> bool:
    return (
        subprocess.run(
            ["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False
        ).returncode
        == 0
    )


def test_the_path_pattern_finds_what_the_docs_cite():
    text = (
        "`infra/config.py`, inventories/<stack>/stack.yml, [x](docs/deploy/index.md), "
        "`Pulumi.<cloud>-<env>.yaml`, CHANGELOG.md, python -m infra.loadgen URL, python -m pytest, "
        "/etc/torchfleet/node.json, ~/.aws/config, s3://bucket/bundles/x, `bundles/<stack>/*`"
    )
    assert cited(text) == {
        "infra/config.py",
        "inventories/<stack>/stack.yml",
        "docs/deploy/index.md",
        "Pulumi.<cloud>-<env>.yaml",
        "CHANGELOG.md",
        "infra/loadgen.py",
    }
    assert not exists("infra/no_such_module.py") and not exists("roles/<role>/nothing.yml")
    assert exists("roles/<role>/defaults/main.yml") and exists(".cache/runs/<stack>/x/")


def test_every_repository_path_cited_in_the_docs_exists():
    """The docs, the READMEs beside the code and the example stacks' comments."""
    missing, seen = [], 0
    for page in [*pages(), *readmes(), *sorted(REPO.glob("Pulumi.*.yaml"))]:
        for path in sorted(cited(page.read_text())):
            seen += 1
            if not exists(path):
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert seen > 100, f"only {seen} citations found: is the pattern still finding them?"
    assert not missing, "cited but not in the repository:\n  " + "\n  ".join(missing)


def test_the_docs_cite_no_file_outside_the_repository():
    named = [
        f"{page.relative_to(REPO)}: {m.group(0)}"
        for page in [*pages(), REPO / "CHANGELOG.md", REPO / "mkdocs.yml"]
        for m in OUTSIDE.finditer(page.read_text())
    ]
    assert not named, "\n".join(named)


def test_every_page_is_in_the_nav_and_the_readme_links_resolve():
    nav = (REPO / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert f": {page.relative_to(DOCS)}" in nav, f"{page} is not in mkdocs.yml's nav"
    links = re.findall(r"\]\(([^)#\s]+)", README.read_text())
    assert links and all((REPO / link).is_file() for link in links), links


def test_every_markdown_file_the_code_cites_exists():
    """Code, scripts and the READMEs beside them cite only Markdown files that are in the
    repository: a bare name must be some tracked file's name, a path must resolve from the root
    or from the citing file's folder. (Expected to fail while the code still cites two files kept
    outside the repository; the change that rewrites those citations removes the mark.)"""
    names = {f.rsplit("/", 1)[-1] for f in TRACKED}
    missing = []
    for name in TRACKED:
        path = REPO / name
        if name.startswith("docs/") or name in ("README.md", "CHANGELOG.md", "mkdocs.yml"):
            continue  # the docs: the tests above; mkdocs.yml's nav is relative to docs/
        if path.is_symlink() or not path.is_file() or path.suffix in (".png", ".gz", ".json"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for md in sorted(set(MARKDOWN.findall(text))):
            found = exists(md) or (path.parent / md).exists() if "/" in md else md in names
            if not found:
                missing.append(f"{name}: {md}")
    assert not missing, "the code cites Markdown files that are not here:\n  " + "\n  ".join(
        missing
    )
