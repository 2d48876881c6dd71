"""`torchfleet-node COMMAND` (boot.py execs `python -m torchfleet_agent COMMAND`)."""

from __future__ import annotations

import json
import sys
import urllib.parse
from typing import Callable, Sequence

from . import boot, image, lifecycle, metrics
from .bootstrap import bootstrap
from .state import State


def fetch(argv: Sequence[str]) -> int:
    """fetch SRC DEST: an s3:// or oss:// object of this node's cloud (the model, for the
    inference_runtime role) with the instance's credentials."""
    if len(argv) != 2:
        print("usage: torchfleet-node fetch s3://BUCKET/KEY|oss://BUCKET/KEY DEST", file=sys.stderr)
        return 2
    src, dest = argv
    parts = urllib.parse.urlsplit(src)
    cfg = boot.load_config()
    if not cfg:
        boot.log(f"no {boot.CONFIG}: no cloud to fetch {src} from")
        return 1
    boot.fetch_object(cfg, parts.netloc, parts.path.lstrip("/"), dest)
    return 0


def status(_argv: Sequence[str]) -> int:
    print(json.dumps(State().doc, indent=2, sort_keys=True))
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "bootstrap": bootstrap,
    "lifecycle-watch": lifecycle.lifecycle_watch,
    "publish-metrics": metrics.publish_metrics,
    "fetch": fetch,
    "status": status,
    "prepare-image": lambda _argv: image.prepare_image(),
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: torchfleet-node " + "|".join(COMMANDS), file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
