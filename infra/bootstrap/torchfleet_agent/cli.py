"""`torchfleet-node COMMAND` (boot.py execs `python -m torchfleet_agent COMMAND`)."""

from __future__ import annotations

import grp
import json
import os
import sys
import urllib.parse
from typing import Callable, Sequence

from . import boot, image, lifecycle, metrics
from .bootstrap import bootstrap
from .cloud import cloud_of
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


def api_token(argv: Sequence[str]) -> int:
    """api-token DEST [GROUP]: the stack's API tokens from the cloud's secret store, read with
    the instance's credentials, into DEST (0640, root:GROUP) for the runtime's api_token_file.
    Run at converge and by the inference_runtime role's timer (a rotation reaches a group's
    nodes that way), so DEST is replaced, atomically, only when the tokens changed: the runtime
    re-reads the file when its inode or mtime moves. Logs how many tokens, never one."""
    if len(argv) not in (1, 2):
        print("usage: torchfleet-node api-token DEST [GROUP]", file=sys.stderr)
        return 2
    cfg = boot.load_config()
    name = (cfg or {}).get("api_token_secret")
    if not cfg or not name:
        boot.log(f"no api_token_secret in {boot.CONFIG}: no token to read")
        return 1
    text = cloud_of(cfg).secret_string(name)
    gid = grp.getgrnam(argv[1]).gr_gid if len(argv) == 2 else -1
    if write_tokens(argv[0], text, gid):
        count = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
        boot.log(f"{count} API token(s) of secret {name} written to {argv[0]}")
    return 0


def write_tokens(dest: str, text: str, gid: int = -1) -> bool:
    """DEST holds `text` (0640, root:gid) afterwards; False when it already did (not touched).
    The tokens' file and the node's certificate and key (node-tls) alike."""
    data = (text.rstrip("\n") + "\n").encode()
    try:
        with open(dest, "rb") as f:
            st = os.fstat(f.fileno())
            same = (
                f.read() == data
                and st.st_mode & 0o7777 == 0o640
                and (gid == -1 or st.st_gid == gid)
                and (os.geteuid() != 0 or st.st_uid == 0)
            )
    except FileNotFoundError:
        same = False
    if same:
        return False
    fd = os.open(dest + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chown(dest + ".tmp", 0 if os.geteuid() == 0 else -1, gid)
    os.chmod(dest + ".tmp", 0o640)
    os.replace(dest + ".tmp", dest)
    return True


def node_tls(argv: Sequence[str]) -> int:
    """node-tls SECRET CERT KEY [GROUP]: the nodes' certificate and key (a stack with
    `tls.backend`; the secret's JSON: certificate, private_key) from the cloud's secret store,
    read with the instance's credentials, into CERT and KEY (0640, root:GROUP: the runtime's
    tls_cert_file and tls_key_file). Logs "written to" when it replaced either file (the role
    then restarts the runtime), nothing when both already held them. Never shows the key."""
    if len(argv) not in (3, 4):
        print("usage: torchfleet-node node-tls SECRET CERT KEY [GROUP]", file=sys.stderr)
        return 2
    cfg = boot.load_config()
    if not cfg:
        boot.log(f"no {boot.CONFIG}: no cloud to read {argv[0]} from")
        return 1
    doc = json.loads(cloud_of(cfg).secret_string(argv[0]))
    gid = grp.getgrnam(argv[3]).gr_gid if len(argv) == 4 else -1
    written = [
        write_tokens(dest, doc[field], gid)
        for dest, field in ((argv[1], "certificate"), (argv[2], "private_key"))
    ]
    if any(written):
        boot.log(f"the nodes' certificate of secret {argv[0]} written to {argv[1]}, {argv[2]}")
    return 0


def status(_argv: Sequence[str]) -> int:
    print(json.dumps(State().doc, indent=2, sort_keys=True))
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "bootstrap": bootstrap,
    "lifecycle-watch": lifecycle.lifecycle_watch,
    "publish-metrics": metrics.publish_metrics,
    "fetch": fetch,
    "api-token": api_token,
    "node-tls": node_tls,
    "status": status,
    "prepare-image": lambda _argv: image.prepare_image(),
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: torchfleet-node " + "|".join(COMMANDS), file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
