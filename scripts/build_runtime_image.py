#!/usr/bin/env python3
"""Build the torchfleet-runtime container image (runtime/Containerfile) from the version matrix.

    scripts/build_runtime_image.py [--profile cu116] [--base IMAGE] [--wheelhouse DIR] ...
    make image [PROFILE=...] [BASE=...] [WHEELHOUSE=...] [TAG=...]

What it does, in order:
1. Build arguments from compat/matrix.yml (read by infra/matrix.py): the profile's torch,
   torchvision and wheel index exactly as the `pytorch` role derives them for a node (its
   defaults are rendered here, so the numpy<2-with-torch-1.x rule has one home), and the
   default base image, on a distro inside its standard support today (the matrix's dates):
   NVIDIA's `<toolkit>-cudnn8-runtime-ubuntuXX.YY` image on the first such Ubuntu of the matrix
   that has the profile's toolkit packages and a Python the profile's torch has wheels for, else
   that Ubuntu's own image (the torch wheel bundles its CUDA libraries); CPU profiles get
   debian:<major>-slim.
2. The torchfleet-compat and runtime wheels from roles/inference_runtime/files/build_wheel.py,
   the builder and cache the Ansible role uses (through infra/bundle.py, which ships the same
   pair to nodes), so a node and an image of one checkout run the same wheels.
3. A build context in .cache/image-build/ (wheels, matrix, container/ files, and the optional
   wheelhouse, extra CA certificates and model to bake), removed afterwards.
4. The base image present locally or pulled, else a stop with the base's name and how to pick
   another: no minutes of work before a failure that was certain from the start.
5. `podman build --format docker` (HEALTHCHECK needs the docker format) or `docker build`.

stdout: one JSON line {"image", "size_bytes", "build_s", "base", "target", "build_args"};
progress and the engine's output go to stderr. --print-args prints the arguments and stops.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchfleet_compat.matrix import support_verdict  # noqa: E402

from infra.bundle import BundleError, node_wheels  # noqa: E402
from infra.matrix import Matrix, MatrixError, load_matrix, matrix_path  # noqa: E402

CONTAINERFILE = REPO / "runtime" / "Containerfile"
CONTAINER_FILES = REPO / "runtime" / "container"
PYTORCH_DEFAULTS = REPO / "roles" / "pytorch" / "defaults" / "main.yml"
CONTEXT_PARENT = REPO / ".cache" / "image-build"
CUDA_IMAGE = "docker.io/nvidia/cuda:{toolkit}-cudnn8-runtime-ubuntu{release}"
CPU_IMAGE = "docker.io/library/debian:{release}-slim"
UBUNTU_IMAGE = "docker.io/library/ubuntu:{release}"
TARGETS = ("runtime", "baked")


class BuildError(Exception):
    """A problem the user can fix (bad profile, missing directory, unpullable base): one line."""


def default_base(matrix: Matrix, profile: str, today: str | None = None) -> str:
    """The base image a node of this profile would be, on a distro inside its standard support
    on `today` (default: the real date): NVIDIA's CUDA image of the profile's toolkit on an
    Ubuntu whose repository has that toolkit and whose Python the profile's torch supports (the
    matrix's own rules); where no supported Ubuntu has the toolkit, that Ubuntu's own image (the
    torch wheel bundles the CUDA libraries it uses); a slim Debian for a CPU profile."""
    today = today or datetime.date.today().isoformat()
    prof = matrix.profile(profile)
    hosts = [
        matrix.distros[name]
        for name in matrix.distros_for(prof)
        if support_verdict(matrix, name, today).ok
    ]
    pythons = ", ".join(prof.pythons)
    ubuntus = [d for d in hosts if d.name.startswith("ubuntu-")]
    if prof.toolkit_version:
        for distro in ubuntus:
            if matrix.toolkit_from_repo(prof, distro.name):
                return CUDA_IMAGE.format(
                    toolkit=prof.toolkit_version, release=distro.name.split("-", 1)[1]
                )
        if ubuntus:
            return UBUNTU_IMAGE.format(release=ubuntus[0].name.split("-", 1)[1])
        raise BuildError(
            f"profile {profile}: no Ubuntu in compat/matrix.yml inside its standard support on "
            f"{today} has one of its Pythons ({pythons}); pass --base"
        )
    for distro in hosts:
        if distro.name.startswith("debian-"):
            return CPU_IMAGE.format(release=distro.name.split("-", 1)[1])
    raise BuildError(
        f"profile {profile}: no Debian in compat/matrix.yml inside its standard support on "
        f"{today} has one of its Pythons ({pythons}); pass --base"
    )


def pytorch_pins(
    profile: dict[str, Any], torch: str | None = None, torchvision: str | None = None
) -> dict[str, str]:
    """torch, torchvision, numpy and the extra index the `pytorch` role installs on a node of
    this profile, from the role's own defaults (Jinja2, rendered against the profile)."""
    defaults = yaml.safe_load(PYTORCH_DEFAULTS.read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def render(key: str, **values: Any) -> str:
        return (
            env.from_string(str(defaults[key])).render(torchfleet_profile=profile, **values).strip()
        )

    torch = torch or render("pytorch_torch_version")
    if torchvision is None:
        torchvision = render("pytorch_torchvision_version")
    return {
        "TORCH": torch,
        "TORCHVISION": torchvision,
        "NUMPY": render("pytorch_numpy_spec", pytorch_torch_version=torch),
        "WHEEL_INDEX": render("pytorch_extra_index_url"),
    }


def build_args(opts: argparse.Namespace, matrix: Matrix) -> dict[str, str]:
    try:
        profile = matrix.profile(opts.profile, "--profile").name
    except MatrixError as err:
        raise BuildError(str(err)) from err
    args = {"BASE": opts.base or default_base(matrix, profile), "CUDA_PROFILE": profile}
    args.update(pytorch_pins(matrix.profiles[profile].as_dict(), opts.torch, opts.torchvision))
    if opts.wheel_index is not None:
        args["WHEEL_INDEX"] = opts.wheel_index
    args["INDEX_URL"] = opts.index_url or ""
    args["WHEELHOUSE"] = "wheelhouse" if opts.wheelhouse else ""
    args["EXTRA_CA_CERTS"] = "ca-certificates" if opts.extra_ca_certs else ""
    # gpu (NVML metrics: the HPA's GPU signal) wherever the profile has CUDA, as the role does
    cuda = matrix.profiles[profile].cuda is not None
    args["RUNTIME_EXTRAS"] = opts.extras if opts.extras is not None else ("gpu" if cuda else "")
    return args


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, **kwargs)


def link_or_copy_tree(src: Path, dest: Path) -> None:
    """Hard links where the filesystem allows (a multi-GB wheelhouse costs nothing), else copies."""
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path.resolve(), target)
        except OSError:
            shutil.copy2(path, target)


def make_context(opts: argparse.Namespace, wheels: tuple[Path, ...]) -> Path:
    CONTEXT_PARENT.mkdir(parents=True, exist_ok=True)
    ctx = Path(tempfile.mkdtemp(prefix="context-", dir=CONTEXT_PARENT))
    (ctx / "wheels").mkdir()
    for wheel in wheels:
        shutil.copy2(wheel, ctx / "wheels" / wheel.name)
    shutil.copy2(matrix_path(), ctx / "matrix.yml")
    shutil.copytree(CONTAINER_FILES, ctx / "container")
    if opts.wheelhouse:
        link_or_copy_tree(Path(opts.wheelhouse).resolve(), ctx / "wheelhouse")
    if opts.extra_ca_certs:
        certs = ctx / "ca-certificates"
        certs.mkdir()
        for item in opts.extra_ca_certs:
            for pem in [item] if item.is_file() else sorted(item.glob("*.crt")):
                shutil.copy2(pem, certs / pem.name)
        if not any(certs.iterdir()):
            raise BuildError(
                f"--extra-ca-certs {' '.join(map(str, opts.extra_ca_certs))}: no *.crt file"
            )
    if opts.model:
        shutil.copytree(opts.model, ctx / "model")
    return ctx


def ensure_base(engine: str, base: str) -> None:
    exists = (
        [engine, "image", "exists", base]
        if engine == "podman"
        else [engine, "image", "inspect", base]
    )
    if run(exists, capture_output=True).returncode == 0:
        return
    log(f"pulling the base image {base}")
    pulled = run([engine, "pull", base], capture_output=True)
    if pulled.returncode != 0:
        reason = (pulled.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(
            f"cannot pull the base image {base}: {reason}\n"
            "No registry reachable? Build on a base image you have locally, e.g.\n"
            "  make image BASE=localhost/torchfleet-bookworm:latest PROFILE=cpu WHEELHOUSE=.cache/wheelhouse-cp311"
        )


def git_revision() -> str:
    head = run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode != 0:
        return ""
    dirty = run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def image_size(engine: str, tag: str) -> int:
    out = run([engine, "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else -1


def parse_cli(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--profile", help="CUDA profile of compat/matrix.yml (default: its default_profile)"
    )
    p.add_argument("--base", help="base image (default: derived from the profile, see above)")
    p.add_argument(
        "--torch", help="torch version instead of the profile's pin (e.g. PyPI's 1.12.1)"
    )
    p.add_argument(
        "--torchvision", help="torchvision version instead of the profile's ('' for none)"
    )
    p.add_argument("--index-url", help="primary package index (a mirror; default: pip's)")
    p.add_argument(
        "--wheel-index", help="extra index with torch's CUDA builds (default: the profile's)"
    )
    p.add_argument(
        "--wheelhouse", type=Path, help="directory of wheels to install from offline (no index)"
    )
    p.add_argument(
        "--extra-ca-certs",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="PEM *.crt files or directories of them to trust in the image (TLS inspection)",
    )
    p.add_argument(
        "--extras",
        help="runtime extras to install, comma-separated: gpu (GPU metrics), onnx (default: "
        "gpu for a CUDA profile, none for cpu; '' for none)",
    )
    p.add_argument(
        "--model", type=Path, help="a model directory to bake into /models (target baked)"
    )
    p.add_argument(
        "--tag", help="image name (default: localhost/torchfleet-runtime:VERSION-PROFILE[-baked])"
    )
    p.add_argument(
        "--engine",
        default=os.environ.get("CONTAINER_ENGINE")
        or ("podman" if shutil.which("podman") else "docker"),
        choices=("podman", "docker"),
        help="container engine (default: podman if installed)",
    )
    p.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    p.add_argument(
        "--print-args", action="store_true", help="print the build arguments as JSON and stop"
    )
    opts = p.parse_args(argv)
    for name in ("wheelhouse", "model"):
        value = getattr(opts, name)
        if value is not None and not value.is_dir():
            p.error(f"--{name} {value}: not a directory")
    for item in opts.extra_ca_certs or []:
        if not item.exists():
            p.error(f"--extra-ca-certs {item}: no such file or directory")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_cli(argv)
    try:
        matrix = load_matrix(str(matrix_path()))
        args = build_args(opts, matrix)
        target = "baked" if opts.model else "runtime"
        if opts.print_args:
            print(json.dumps({"base": args["BASE"], "target": target, "build_args": args}))
            return 0
        try:
            wheels = node_wheels()  # (compat, runtime)
        except BundleError as err:
            raise BuildError(str(err)) from err
        version = wheels[1].name.split("-")[1]
        args["RUNTIME_VERSION"] = version
        tag = opts.tag or f"localhost/torchfleet-runtime:{version}-{args['CUDA_PROFILE']}" + (
            "-baked" if opts.model else ""
        )
        ensure_base(opts.engine, args["BASE"])
        ctx = make_context(opts, wheels)
        try:
            cmd = [opts.engine, "build", "-f", str(CONTAINERFILE), "--target", target, "-t", tag]
            if opts.engine == "podman":
                cmd += ["--format", "docker"]
            if opts.no_cache:
                cmd.append("--no-cache")
            for key, value in args.items():
                cmd += ["--build-arg", f"{key}={value}"]
            created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            cmd += [
                "--label",
                f"org.opencontainers.image.created={created}",
                "--label",
                f"org.opencontainers.image.revision={git_revision()}",
                str(ctx),
            ]
            log(
                f"building {tag} ({target}) on {args['BASE']}, profile {args['CUDA_PROFILE']}, torch {args['TORCH']}"
            )
            started = time.monotonic()
            built = run(cmd, stdout=sys.stderr, env=dict(os.environ, DOCKER_BUILDKIT="1"))
            seconds = time.monotonic() - started
        finally:
            shutil.rmtree(ctx, ignore_errors=True)
        if built.returncode != 0:
            raise BuildError(
                f"{opts.engine} build failed (exit {built.returncode}); its output is above"
            )
    except BuildError as exc:
        print(f"build_runtime_image: {exc}", file=sys.stderr)
        return 1
    size = image_size(opts.engine, tag)
    log(f"built {tag} in {seconds:.0f} s, {size / 1e6:.0f} MB")
    print(
        json.dumps(
            {
                "image": tag,
                "size_bytes": size,
                "build_s": round(seconds, 1),
                "base": args["BASE"],
                "target": target,
                "build_args": args,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
