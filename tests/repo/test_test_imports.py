"""Test modules import their helpers by a name no other test directory uses.

Several test directories put themselves on sys.path (their conftest.py does) so their helper
modules import by bare name. Run together in one pytest call, every such directory is on
sys.path at once: a bare `conftest` then names whichever directory came last, and so would a
helper module's name that two directories share. So no test module imports `conftest` (shared
helpers live in a plain module beside it: tests/runtime/rt_helpers.py, tests/image/image_helpers.py)
and every module under tests/ that is imported by bare name exists there once. Nor does any module
import a test module (test_*.py): what tests share lives in those helper modules, fixtures in
conftest.py, so a test module runs, and is read, on its own.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def by_name_imports(root: Path) -> tuple[dict[str, list[Path]], list[tuple[Path, str]]]:
    """({name: the files under `root` called name.py}, [(a file, a bare name it imports)])."""
    files: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        files[path.stem].append(path)
    imports: list[tuple[Path, str]] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            imports += [(path, name) for name in names if "." not in name and name in files]
    return files, imports


def imports_of_test_modules(root: Path) -> list[tuple[Path, str]]:
    """[(a file under `root`, the test module under `root` it imports)]: by bare name, by a dotted
    one (`tests.runtime.test_batching`), relatively, or as a name from its package."""
    tests = {path.stem for path in root.rglob("test_*.py")}
    out: list[tuple[Path, str]] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                sep = "." if node.module else ""
                names = [base] + [f"{base}{sep}{alias.name}" for alias in node.names]
            else:
                continue
            out += [(path, name) for name in names if name.rpartition(".")[2] in tests]
    return out


def problems(root: Path) -> list[str]:
    files, imports = by_name_imports(root)
    out = []
    for path, name in imports:
        where = path.relative_to(root)
        if name == "conftest":
            out.append(f"{where} imports conftest: move what it needs into a helper module")
        elif len(files[name]) > 1:
            others = ", ".join(str(p.relative_to(root)) for p in files[name])
            out.append(f"{where} imports {name!r} by name, which is not unique: {others}")
    for path, name in imports_of_test_modules(root):
        where = path.relative_to(root)
        out.append(
            f"{where} imports the test module {name!r}: move what it shares into a helper module"
            " (fixtures: conftest.py)"
        )
    return out


def test_no_module_imports_conftest_a_test_module_or_a_name_two_directories_share():
    _, imports = by_name_imports(ROOT / "tests")
    # the check saw what it guards: helper modules imported by name from several directories
    assert {"rt_helpers", "rt_models", "image_helpers"} <= {name for _, name in imports}
    assert problems(ROOT / "tests") == []


def test_the_check_names_a_conftest_import_and_a_shared_name(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "conftest.py").write_text("")
        (tmp_path / folder / "helpers.py").write_text("")
    (tmp_path / "a" / "test_x.py").write_text("from conftest import Client\n")
    (tmp_path / "b" / "test_y.py").write_text("def f():\n    import helpers\n")
    found = problems(tmp_path)
    assert found == [
        "a/test_x.py imports conftest: move what it needs into a helper module",
        "b/test_y.py imports 'helpers' by name, which is not unique: a/helpers.py, b/helpers.py",
    ]


def test_the_check_names_every_way_of_importing_a_test_module(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "test_x.py").write_text("def wait_until(): ...\n")
    (tmp_path / "a" / "a_helpers.py").write_text("def wait_until(): ...\n")
    (tmp_path / "a" / "test_y.py").write_text(
        "import a_helpers\n"  # a helper module: allowed
        "from a_helpers import wait_until\n"
        "from test_x import wait_until\n"
        "def f():\n"
        "    import test_x\n"
        "    from a.test_x import wait_until\n"
        "    from . import test_x\n"
        "    from .test_x import wait_until\n"
        "    from a import test_x\n"
    )
    why = ": move what it shares into a helper module (fixtures: conftest.py)"
    assert problems(tmp_path) == [
        f"a/test_y.py imports the test module {name!r}{why}"
        for name in ("test_x", "test_x", "a.test_x", ".test_x", ".test_x", "a.test_x")
    ]
