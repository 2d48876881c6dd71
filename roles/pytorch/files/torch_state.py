# Run with the virtualenv's interpreter: argv is the report cache's path, then the pinned
# requirements. Prints JSON {"satisfied", "installed": {name: version|null}, "report", "asked"}.
#
# satisfied: every requirement is installed. pip's own vendored `packaging` decides, so
#   "torch==2.13.0" accepts "2.13.0+cpu" exactly as pip would, on Python 3.8+ with nothing extra.
# report: what torch says about itself (version, CUDA build, GPU access, the numpy round trip
#   that catches torch 1.x + numpy 2.x), null while a requirement is missing. Importing torch
#   costs more than everything else a re-run does in this role, so the answer is cached beside
#   the venv and reused while what it depends on is unchanged: the installed versions, torch's
#   files and the loaded NVIDIA driver (a node booted from an image baked without a GPU asks
#   again). asked: torch was imported this time.
import hashlib
import json
import os
import sys

try:
    from importlib.metadata import PackageNotFoundError, distribution
except ImportError:  # Python 3.7
    from importlib_metadata import PackageNotFoundError, distribution
from pip._vendor.packaging.requirements import Requirement


def driver_state():
    try:
        with open("/proc/driver/nvidia/version") as f:
            loaded = f.readline().strip()
    except OSError:
        loaded = None
    return {"loaded": loaded, "device": os.path.exists("/dev/nvidia0")}


def ask_torch():
    import torch

    report = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "numpy_bridge": None,
    }
    try:
        import numpy

        report["numpy"] = numpy.__version__
        report["numpy_bridge"] = torch.from_numpy(numpy.ones(2)).sum().item() == 2.0
    except Exception as exc:  # report it; the role's assert says what to change
        report["numpy_bridge"] = False
        report["numpy_error"] = str(exc)
    return report


def main():
    cache, specs = sys.argv[1], sys.argv[2:]
    installed, stamps, satisfied = {}, {}, True
    for spec in specs:
        req = Requirement(spec)
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            dist = None
        have = dist.version if dist else None
        installed[req.name] = have
        if have is None or not req.specifier.contains(have, prereleases=True):
            satisfied = False
        elif req.name in ("torch", "numpy"):
            # the installed files, as pip recorded them (a reinstall of another build changes it)
            stamps[req.name] = hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest()
    result = {"satisfied": satisfied, "installed": installed, "report": None, "asked": False}
    if satisfied:
        key = {
            "python": sys.version,
            "installed": installed,
            "files": stamps,
            "driver": driver_state(),
        }
        try:
            with open(cache) as f:
                cached = json.load(f)
        except (OSError, ValueError):
            cached = {}
        if cached.get("key") == key and isinstance(cached.get("report"), dict):
            result["report"] = cached["report"]
        else:
            result["report"], result["asked"] = ask_torch(), True
            tmp = cache + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"key": key, "report": result["report"]}, f)
            os.replace(tmp, cache)
    print(json.dumps(result))


main()
