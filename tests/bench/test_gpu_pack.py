"""`torchfleet-bench gpu-pack` (benchmarks/torchfleet_bench/gpu_pack.py): what a pack for a bare
GPU machine holds and how it checks itself there. Only the pure parts: building a pack downloads
wheels and Debian packages (the dry run in benchmarks/README.md does that)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from torchfleet_bench import BenchError, gpu_pack


def test_pins_are_read_without_comments_markers_extras_or_local_tags():
    pins = gpu_pack.read_pins(
        [
            "# a comment",
            "torch==2.13.0+cpu",
            "prometheus_client==0.26.0  # why",
            "defspec[offline]==0.7.1",
            "uvloop==0.21.0 ; sys_platform != 'win32'",
            "not-pinned>=1",
            "",
        ]
    )
    assert pins == {
        "torch": "2.13.0",
        "prometheus-client": "0.26.0",
        "defspec": "0.7.1",
        "uvloop": "0.21.0",
    }


def test_the_manifest_leaves_out_what_the_machine_has_torch_deps_and_the_tree():
    specs = gpu_pack.manifest(
        runtime_deps=["torchfleet-compat>=0.1", "torch>=1.12", "PyYAML>=5.4", "httptools>=0.6.4"],
        mosec_lock={"mosec": "0.9.8", "msgspec": "0.23.0", "sympy": "1.14.0", "torch": "2.13.0"},
        pins={"httptools": "0.9.0", "msgspec": "0.22.0", "pytest-timeout": "2.4.0"},
        torch_deps=["sympy"],
    )
    # the repository's lock wins over Mosec's where both pin a name (msgspec)
    assert specs == ["httptools==0.9.0", "mosec==0.9.8", "msgspec==0.22.0", "pytest-timeout==2.4.0"]


def test_an_unpinned_dependency_is_refused_by_name():
    with pytest.raises(BenchError) as err:
        gpu_pack.manifest(["orjson>=3.9"], {}, pins={}, extras=())
    assert str(err.value) == (
        "unpinned pack dependency = 'orjson' is invalid; allowed: a name pinned in "
        "requirements/constraints.txt or the Mosec lock"
    )


def test_the_trees_manifest_packs_mosec_and_the_runtimes_missing_deps_never_torch():
    specs = gpu_pack.specs_for_tree()
    names = {s.split("==")[0] for s in specs}
    assert {"mosec", "msgspec", "httptools", "orjson", "pytest-timeout"} <= names
    assert not names & {"torch", "numpy", "sympy", "networkx", "prometheus-client", "pyyaml"}
    assert all("==" in s for s in specs)


def test_the_source_hash_follows_the_sources_not_the_folder(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d / "runtime" / "src" / "pkg").mkdir(parents=True)
        (tmp_path / d / "runtime" / "src" / "pkg" / "m.py").write_text("x = 1\n")
    a, b = tmp_path / "a", tmp_path / "b"
    assert gpu_pack.tree_hash(a, ["runtime/src"]) == gpu_pack.tree_hash(b, ["runtime/src"])
    (b / "runtime" / "src" / "pkg" / "m.py").write_text("x = 2\n")
    assert gpu_pack.tree_hash(a, ["runtime/src"]) != gpu_pack.tree_hash(b, ["runtime/src"])


def test_verify_warns_of_another_python_and_of_changed_sources(tmp_path):
    root = tmp_path / "repo"
    for d in gpu_pack.SOURCE_DIRS:
        (root / d).mkdir(parents=True)
        (root / d / "m.py").write_text("x = 1\n")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    man = tmp_path / "manifest.json"
    info = {"python_version": here, "source_hash": gpu_pack.tree_hash(root), "source_commit": "abc"}
    man.write_text(json.dumps(info))
    assert gpu_pack.verify(man, root) == []
    man.write_text(json.dumps({**info, "python_version": "3.99"}))
    (root / gpu_pack.SOURCE_DIRS[0] / "m.py").write_text("x = 2\n")
    warnings = gpu_pack.verify(man, root)
    assert len(warnings) == 2
    assert "wheels for Python 3.99" in warnings[0] and f"--python-version {here}" in warnings[0]
    assert "rebuild the pack" in warnings[1]


def test_the_device_call_carries_the_pack_relative_to_the_tree(tmp_path):
    call = gpu_pack.device_call(tmp_path / ".cache" / "gpu-pack", root=tmp_path)
    assert call == {
        "command": "bash .cache/gpu-pack/run.sh",
        "carry": [".cache/gpu-pack"],
        "timeout_s": 420,
    }


def test_the_entry_script_installs_without_an_index_and_parses():
    script = gpu_pack.Path(gpu_pack.__file__).with_name("gpu_pack_run.sh")
    text = script.read_text()
    assert "--no-index --no-deps --target" in text and "PEERS_MOSEC_BIN" in text
    bash = shutil.which("bash")
    assert bash
    import subprocess

    assert subprocess.run([bash, "-n", str(script)]).returncode == 0


def test_a_python_version_that_is_not_major_minor_is_refused(capsys):
    with pytest.raises(SystemExit) as done:
        gpu_pack.main(["--python-version", "cp312", "--out", "unused"])
    assert done.value.code == 2
    assert "--python-version = 'cp312' is invalid; allowed: MAJOR.MINOR" in capsys.readouterr().err
