# Run with the virtualenv's interpreter: is every requirement given on the command line
# already installed? Prints JSON {"satisfied": bool, "installed": {name: version|null}}.
# Uses pip's own vendored `packaging`, so "torch==2.13.0" accepts "2.13.0+cpu" exactly as
# pip would, and works on Python 3.8+ without any extra package on the node.
import json
import sys

try:
    from importlib.metadata import PackageNotFoundError, version
except ImportError:  # Python 3.7
    from importlib_metadata import PackageNotFoundError, version
from pip._vendor.packaging.requirements import Requirement

installed = {}
satisfied = True
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    installed[req.name] = have
    if have is None or not req.specifier.contains(have, prereleases=True):
        satisfied = False
print(json.dumps({"satisfied": satisfied, "installed": installed}))
