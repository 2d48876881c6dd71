"""The node bundle: everything a node needs to configure itself, as one reproducible .tar.gz.

    python -m infra.bundle STACK [--dest DIR]        (make bundle STACK=aws-prod)

`build(stack)` packs playbooks/, roles/, compat/matrix.yml, torchfleet-compat's package
(compat/src/: the preflight module's module_utils), inventories/<stack>/group_vars/, the
torchfleet-compat and runtime wheels (built by the inference_runtime role's own builder,
roles/inference_runtime/files/build_wheel.py), the node agent (agent/torchfleet_agent/, which the
user-data stub runs) and its Ansible callback (bootstrap/callback_plugins/), node.json (the stack
facts every node of the stack shares, the same variables the operator's inventory carries, and
the instance-type -> GPU table a node looks its own type up in) and manifest.json (format, stack,
content version, the model reference, every file with its sha256).

Reproducible: members sorted, mtimes fixed, owner root, modes 0644/0755, gzip mtime 0, so the
same tree gives the same bytes and the same sha256 (which is what rolls a group: a new bundle
means new user-data). Nothing outside the tree goes in: no git commit, no build time. Cached by
content under .cache/bundles/, so `make plan` and the tests build once per change.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from infra.matrix import REPO_ROOT

if TYPE_CHECKING:
    from infra.config import StackConfig

FORMAT = 1
FIXED_MTIME = 315532800  # 1980-01-01, what the wheel builder uses (SOURCE_DATE_EPOCH)
CACHE = REPO_ROOT / ".cache" / "bundles"
WHEEL_BUILDER = REPO_ROOT / "roles" / "inference_runtime" / "files" / "build_wheel.py"
WHEEL_CACHE = REPO_ROOT / ".cache" / "runtime-wheels"  # the role's default cache directory
CALLBACKS = REPO_ROOT / "infra" / "bootstrap" / "callback_plugins"
AGENT = REPO_ROOT / "infra" / "bootstrap" / "torchfleet_agent"
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "molecule"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".retry", ".swp", "~")
MODEL_KEYS = (
    "inference_runtime_model_source",
    "inference_runtime_model_checksum",
    "inference_runtime_metadata_source",
    "inference_runtime_metadata_checksum",
)


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class Bundle:
    path: Path  # the .tar.gz on the controller
    sha256: str  # hex digest of the file's bytes
    key: str  # object key: f"bundles/{stack}/{sha256}.tar.gz"
    version: str  # human-readable: f"{git describe or 'nogit'}-{sha256[:12]}"


def _files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(SKIP_SUFFIXES) and not name.startswith("."):
                yield Path(dirpath, name)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stack_facts(stack: str, cfg: StackConfig | None = None) -> dict[str, Any]:
    """node.json for a stack: the group variables of its inventory output (infra.inventory)
    without the SSH login, and the GPU of every instance type of its cloud (infra.catalog).
    `cfg`: the program's validated config; None reads and validates Pulumi.<stack>.yaml."""
    from infra import config, inventory, stacks

    if cfg is None:
        try:
            raw = stacks.load_stack_config(stack)
        except FileNotFoundError as err:
            raise BundleError(str(err)) from err
        cfg = config.load(config.raw_from_pulumi_config(raw), stack)
    shared = {k: v for k, v in inventory.group_vars(cfg, "").items() if k != "ansible_user"}
    return {"group_vars": shared, "instance_types": inventory.gpu_types(cfg.cloud)}


def stack_model(stack: str) -> dict[str, str]:
    """The model the stack's inventories/<stack>/group_vars name ({"model_source": ...,
    "model_checksum": ...}, as the manifest's): what a node serves without a rollout's
    override (infra/rollout/tracks.py reads the stable track's file from it)."""
    return _model_reference(REPO_ROOT / "inventories" / stack / "group_vars")


def _model_reference(group_vars: Path) -> dict[str, str]:
    """The model the stack's group vars name (what a node will fetch), for the manifest."""
    found: dict[str, str] = {}
    for path in _files(group_vars):
        if path.suffix not in (".yml", ".yaml", ".json") and path.name != "all":
            continue
        text = path.read_text()
        if text.startswith("$ANSIBLE_VAULT"):
            continue
        doc = yaml.safe_load(text) or {}
        if isinstance(doc, dict):
            found.update({k: str(doc[k]) for k in MODEL_KEYS if doc.get(k) not in (None, "")})
    return {k.removeprefix("inference_runtime_"): v for k, v in sorted(found.items())}


def node_wheels() -> tuple[Path, Path]:
    """(torchfleet-compat, runtime) wheels from the role's builder (cached by source content)."""
    out = subprocess.run(
        [
            sys.executable,
            str(WHEEL_BUILDER),
            str(WHEEL_CACHE),
            str(REPO_ROOT / "compat"),
            str(REPO_ROOT / "runtime"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BundleError(f"building the node's wheels failed:\n{out.stderr[-3000:]}")
    compat, runtime = (Path(w["wheel"]) for w in json.loads(out.stdout)["wheels"])
    return compat, runtime


def _members(
    stack: str, group_vars: Path, facts: Mapping[str, Any], wheels: tuple[Path, Path]
) -> dict[str, bytes]:
    compat_wheel, wheel = wheels
    members: dict[str, bytes] = {}
    for top in ("playbooks", "roles", "compat/src"):
        for path in _files(REPO_ROOT / top):
            if path.suffix == ".py" or top != "compat/src":  # no build metadata (egg-info)
                members[path.relative_to(REPO_ROOT).as_posix()] = path.read_bytes()
    members["compat/matrix.yml"] = (REPO_ROOT / "compat" / "matrix.yml").read_bytes()
    for path in _files(group_vars):
        members[f"inventories/{stack}/group_vars/{path.relative_to(group_vars).as_posix()}"] = (
            path.read_bytes()
        )
    for path in _files(CALLBACKS):
        members[f"bootstrap/callback_plugins/{path.name}"] = path.read_bytes()
    for path in _files(AGENT):
        members[f"agent/{AGENT.name}/{path.relative_to(AGENT).as_posix()}"] = path.read_bytes()
    members[f"wheels/{wheel.name}"] = wheel.read_bytes()
    members[f"wheels/{compat_wheel.name}"] = compat_wheel.read_bytes()
    members["node.json"] = (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode()
    files = {name: _sha256(data) for name, data in sorted(members.items())}
    content = _sha256(json.dumps(files, sort_keys=True).encode())
    manifest = {
        "format": FORMAT,
        "stack": stack,
        "version": f"content-{content[:16]}",
        "runtime_wheel": f"wheels/{wheel.name}",
        "compat_wheel": f"wheels/{compat_wheel.name}",
        "model": _model_reference(group_vars),
        "files": files,
    }
    members["manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    return members


def _archive(members: Mapping[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs = sorted(
            {str(Path(n).parents[i]) for n in members for i in range(len(Path(n).parents) - 1)}
        )
        for name in sorted([*dirs, *members]):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = (
                FIXED_MTIME,
                0,
                0,
                "root",
                "root",
            )
            if name in members:
                data = members[name]
                info.size = len(data)
                executable = data.startswith(b"#!")
                info.mode = 0o755 if executable else 0o644
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _describe() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--tags", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "nogit"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "nogit"


def build(
    stack: str,
    dest: Path | None = None,
    *,
    config: StackConfig | None = None,
    group_vars: Path | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Bundle:
    """Reproducible (same tree -> same bytes), cached by content; contains playbooks/, roles/,
    compat/ (matrix.yml, the package), inventories/<stack>/group_vars/, the wheels, node.json and a
    manifest.json (version, stack, file list with sha256, the model reference).

    `dest`: a directory to put a copy in (default: the cache file itself). `config`: the
    program's validated StackConfig (else Pulumi.<stack>.yaml is read; a Pulumi secret there
    stops that, as it stops the offline plan). `group_vars` and `facts` replace the stack's
    inventories/<stack>/group_vars/ and its facts (tests bundle a CPU node that no valid stack
    config describes)."""
    group_vars = group_vars or REPO_ROOT / "inventories" / stack / "group_vars"
    if not group_vars.is_dir():
        raise BundleError(
            f"{group_vars} does not exist: a bundle carries the stack's group vars "
            f"(stacks with inventories: "
            f"{', '.join(sorted(p.parent.name for p in (REPO_ROOT / 'inventories').glob('*/group_vars')))})"
        )
    facts = dict(facts) if facts is not None else stack_facts(stack, config)
    members = _members(stack, group_vars, facts, node_wheels())
    # The manifest's version digests every member: it is the cache key.
    key = json.loads(members["manifest.json"])["version"]
    path = CACHE / stack / f"{key}.tar.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.part")
        tmp.write_bytes(_archive(members))
        tmp.replace(path)
    data = path.read_bytes()
    digest = _sha256(data)
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
        path = dest / f"{stack}-{digest[:12]}.tar.gz"
        path.write_bytes(data)
    return Bundle(
        path=path,
        sha256=digest,
        key=f"bundles/{stack}/{digest}.tar.gz",
        version=f"{_describe()}-{digest[:12]}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stack")
    parser.add_argument("--dest", type=Path, help="directory for the .tar.gz")
    args = parser.parse_args(argv)
    from infra.config import ConfigError

    try:
        bundle = build(args.stack, args.dest)
    except (BundleError, ConfigError) as err:
        print(f"bundle: {args.stack}: {err}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                "path": str(bundle.path),
                "sha256": bundle.sha256,
                "key": bundle.key,
                "version": bundle.version,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
