"""Every cell of compat/matrix.yml judged through all three entry points, which must agree.

The compatibility rules live in one package (compat/src/torchfleet_compat: matrix.py holds the
rules, judge.py the one judge of a node). Three layers judge a node with it, each from what it
can see:
- infra (`infra.config.load`): a stack's instance type (its GPU model), cuda_profile and
  image_distro, before any resource exists;
- the preflight role's module (torchfleet_compat.preflight, the module's whole body): a bare
  node's lspci name, Python and distro;
- `torchfleet-runtime check` (the judge on an installed node): the nvidia-smi name (no compute
  capability, so the name must be matched), torch and arch list.

For every (GPU, profile, distro, Python) cell, the verdict of each rule (distro, python, gpu)
must be the same in every layer that can see the cell, and equal to the rule computed here
straight from the YAML (so a shared bug in the package fails too). infra sees only the cells
whose Python is the distro's own (a stack picks the image, hence its Python) and the GPUs of
its catalog. A Python below the runtime's own floor (3.7: cu116's torch has it, the runtime
does not) is refused by every layer.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import pytest
import yaml
from torchfleet_compat import preflight
from torchfleet_compat.judge import Options, judge
from torchfleet_compat.matrix import FAIL, OK, SUPPORT, match_gpu
from torchfleet_compat.probe import Disk, Gpu, Kernel, NodeFacts

from infra import catalog
from infra.config import ConfigError, load
from infra.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "compat/matrix.yml").read_text())

# What each GPU calls itself: lspci's pci.ids name (a bare node) and nvidia-smi's name (a node
# with a driver). Each must resolve to its matrix key.
NAMES = {
    "V100": ("GV100GL [Tesla V100 SXM2 16GB]", "Tesla V100-SXM2-16GB"),
    "T4": ("TU104GL [Tesla T4]", "Tesla T4"),
    "A100": ("GA100 [A100 SXM4 40GB]", "NVIDIA A100-SXM4-40GB"),
    "A100-80G": ("GA100 [A100 SXM4 80GB]", "NVIDIA A100-SXM4-80GB"),
    "A10G": ("GA102GL [A10G]", "NVIDIA A10G"),
    "A10": ("GA102GL [A10]", "NVIDIA A10"),
    "L4": ("AD104GL [L4]", "NVIDIA L4"),
    "L40S": ("AD102GL [L40S]", "NVIDIA L40S"),
    "H100": ("GH100 [H100 SXM5 80GB HBM3]", "NVIDIA H100 80GB HBM3"),
    "H200": ("GH100 [H200 SXM 141GB]", "NVIDIA H200"),
}
NO_GPU = "none"
UNLISTED_DISTRO = "debian-10"


def _minor(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


PYTHONS = sorted(
    {p for prof in RAW["profiles"].values() for p in prof["pythons"]}
    | {d["python"] for d in RAW["distros"].values()}
    | {"3.14"},  # a Python no profile has
    key=_minor,
)
GPUS = [*RAW["gpus"], NO_GPU]
DISTROS = [*RAW["distros"], UNLISTED_DISTRO]


def expected(gpu: str, profile: str, distro: str, python: str) -> dict[str, bool]:
    """The rules, written out from the YAML (not through the module)."""
    prof = RAW["profiles"][profile]
    runtime = tomllib.loads((ROOT / "runtime/pyproject.toml").read_text())["project"][
        "requires-python"
    ]
    floor = _minor(runtime.removeprefix(">="))
    out = {
        "distro": distro in RAW["distros"],
        "python": python in prof["pythons"] and _minor(python) >= floor,
    }
    if gpu != NO_GPU:
        cc = _minor(RAW["gpus"][gpu]["compute_capability"])
        out["gpu"] = bool(prof["cuda"]) and min(
            map(_minor, prof["compute_capabilities"])
        ) <= cc <= _minor(prof["max_compute_capability"])
    return out


# --------------------------------------------------------------------------- the preflight


def via_probe(gpu: str, profile: str, distro: str, python: str) -> dict[str, bool]:
    matrix = load_matrix()
    pci = []
    if gpu != NO_GPU:
        name = NAMES[gpu][0]
        model = match_gpu(name, list(matrix.gpus)) or ""
        pci = [Gpu(0, name, None, model, "lspci", device_id="0x0000", address="0000:00:1e.0")]
    facts = NodeFacts(
        python_version=python + ".1",
        python_executable="/usr/bin/python3",
        distro=distro,
        disk=Disk("/opt", "/opt", 10**12),
        pci=pci,
        lspci_available=True,
        kernel=Kernel("6.1.0", "/x", True),
        apt_lists_present=True,
    )
    params = {k: v.get("default") for k, v in preflight.ARGUMENTS.items()}
    params.update(profile=profile)
    result = preflight.result(matrix, facts, params)
    if gpu != NO_GPU:
        assert result["ansible_facts"]["torchfleet_gpu_model"] == gpu
    rules = result["rules"]
    # the role prints the module's reasons; a refused rule is in the problems, a passed one not
    assert len(result["problems"]) == sum(not ok for ok in rules.values())
    return rules


# --------------------------------------------------------------------------- check


def via_check(gpu: str, profile: str, distro: str, python: str) -> dict[str, bool]:
    matrix = load_matrix()
    prof = matrix.profiles[profile]
    has_gpu = gpu != NO_GPU
    facts = NodeFacts(
        python_version=python + ".1",
        torch_version=prof.torch,
        torch_cuda=prof.cuda,
        cuda_available=has_gpu and prof.cuda is not None,
        arch_list=["sm_" + c.replace(".", "") for c in prof.compute_capabilities],
        cudnn_version=8902 if prof.cuda else None,
        driver_version="580.65.06" if has_gpu else None,
        driver_source="nvidia-smi" if has_gpu else None,
        # nvidia-smi's name only: check must match it to the matrix for the capability
        gpus=[Gpu(0, NAMES[gpu][1], None)] if has_gpu else [],
        distro=distro,
        disk=Disk("/", "/", 10**12),
        mem_total_bytes=64 << 30,
        mem_available_bytes=60 << 30,
    )
    _, checks = judge(facts, matrix, Options(profile=profile))
    by_name = {c.name: c for c in checks}
    distro_row = by_name["distro"]
    # a distro past its standard support is a warning of its own rule: the distro rule passed
    out = {
        "distro": distro_row.status == OK or distro_row.rule == SUPPORT,
        "python": by_name["python"].status == OK,
    }
    if has_gpu:
        arch = [c for c in checks if c.name.startswith("gpu arch")]
        assert len(arch) == 1, checks
        out["gpu"] = arch[0].status != FAIL
    return out


# --------------------------------------------------------------------------- infra


def _stack_for(gpu: str) -> tuple[str, int] | None:
    """(stack, GPU count) of an instance type carrying this GPU, in either cloud's catalog."""
    for stack, cloud in (("aws-dev", "aws"), ("alicloud-dev", "alicloud")):
        counts = [t.gpu_count for t in catalog.instance_types(cloud).values() if t.gpu_model == gpu]
        if counts:
            return stack, min(counts)
    return None


def via_infra(settings, gpu: str, profile: str, distro: str) -> dict[str, bool]:
    stack, count = _stack_for(gpu)
    raw = dict(settings(stack))
    raw.pop("instance_type", None)
    raw.update(gpu={"model": gpu, "count": count}, cuda_profile=profile, image_distro=distro)
    try:
        load(raw, stack)
    except ConfigError as err:
        lines = [line for line in str(err).splitlines() if "torchfleet:" in line]
        # nothing but the profile is wrong in these stacks
        assert lines and all("torchfleet:cuda_profile" in line for line in lines), str(err)
        text = str(err)
        return {
            "distro": True,
            "python": f"a profile for {distro}'s Python" not in text,
            "gpu": "a profile that drives the" not in text,
        }
    return {"distro": True, "python": True, "gpu": True}


CELLS = list(itertools.product(GPUS, RAW["profiles"], DISTROS, PYTHONS))


def test_the_table_covers_the_whole_matrix():
    assert {c[0] for c in CELLS} == set(RAW["gpus"]) | {NO_GPU}
    assert {c[1] for c in CELLS} == set(RAW["profiles"])
    assert set(RAW["distros"]) < {c[2] for c in CELLS}
    # every distro's own Python is a row, so infra's cells are all in the table
    assert {d["python"] for d in RAW["distros"].values()} <= set(PYTHONS)
    # and the table has both verdicts for every rule (a table of passes proves nothing)
    for rule in ("distro", "python", "gpu"):
        assert {expected(*c).get(rule) for c in CELLS} >= {True, False}


@pytest.mark.parametrize("gpu", GPUS)
def test_probe_and_check_agree_with_the_matrix(gpu):
    disagreements = []
    for _, profile, distro, python in (c for c in CELLS if c[0] == gpu):
        want = expected(gpu, profile, distro, python)
        got = {
            "probe": via_probe(gpu, profile, distro, python),
            "check": via_check(gpu, profile, distro, python),
        }
        for layer, rules in got.items():
            if rules != want:
                disagreements.append(
                    f"{layer} {gpu}/{profile}/{distro}/py{python}: {rules} != {want}"
                )
    assert not disagreements, "\n".join(disagreements)


def test_infra_agrees_with_the_matrix(settings):
    covered, disagreements = set(), []
    for gpu, profile, distro in itertools.product(RAW["gpus"], RAW["profiles"], RAW["distros"]):
        if _stack_for(gpu) is None:
            continue  # no instance type of either cloud carries it
        covered.add(gpu)
        python = RAW["distros"][distro]["python"]
        want = expected(gpu, profile, distro, python)
        got = via_infra(settings, gpu, profile, distro)
        if got != want:
            disagreements.append(f"infra {gpu}/{profile}/{distro}: {got} != {want}")
    assert not disagreements, "\n".join(disagreements)
    # every GPU either catalog sells is judged (the others are the matrix's own, for nodes
    # brought by hand)
    assert covered == set(catalog.gpu_models("aws")) | set(catalog.gpu_models("alicloud"))
