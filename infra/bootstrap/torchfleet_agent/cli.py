"""`torchfleet-node COMMAND` (boot.py execs `python -m torchfleet_agent COMMAND`)."""

from __future__ import annotations

import grp
import json
import sys
import urllib.parse
from typing import Callable, Iterable, Sequence

from . import boot, image, lifecycle, metrics
from .bootstrap import bootstrap
from .cloud import cloud_of
from .local import JOURNAL_TLS_CA, JOURNAL_TLS_CERT, JOURNAL_TLS_KEY
from .secret_files import TLS_FIELDS, write_fields, write_file
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
    if write_file(argv[0], text, gid):
        count = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
        boot.log(f"{count} API token(s) of secret {name} written to {argv[0]}")
    return 0


def node_tls(argv: Sequence[str]) -> int:
    """node-tls SECRET CERT KEY [GROUP]: the nodes' certificate and key (a stack with
    `tls.backend`; the secret's JSON: certificate, private_key) from the cloud's secret store,
    read with the instance's credentials, into CERT and KEY (0640, root:GROUP: the runtime's
    tls_cert_file and tls_key_file). Logs "written to" when it replaced either file (the role
    then restarts the runtime), nothing when both already held them. Never shows the key."""
    if len(argv) not in (3, 4):
        print("usage: torchfleet-node node-tls SECRET CERT KEY [GROUP]", file=sys.stderr)
        return 2
    gid = grp.getgrnam(argv[3]).gr_gid if len(argv) == 4 else -1
    return _secret_files("the nodes' certificate", argv[0], zip(argv[1:3], TLS_FIELDS), gid)


def journal_tls(argv: Sequence[str]) -> int:
    """journal-tls SECRET CERT KEY CA: the node's journal upload certificate, key and the
    journal CA (the secret's JSON: certificate, private_key, ca; a stack with monitoring) from
    the cloud's secret store, read with the instance's credentials, into CERT, KEY and CA (0640
    root:root; the monitoring role's monitoring_logs_tls_command appends the three paths, by
    default JOURNAL_TLS_CERT, JOURNAL_TLS_KEY and JOURNAL_TLS_CA of local.py). Logs "written to"
    when it replaced a file (the role then restarts journal-upload), nothing otherwise."""
    if len(argv) != 4:
        print(
            "usage: torchfleet-node journal-tls SECRET CERT KEY CA "
            f"(e.g. {JOURNAL_TLS_CERT} {JOURNAL_TLS_KEY} {JOURNAL_TLS_CA})",
            file=sys.stderr,
        )
        return 2
    return _secret_files("the journal's certificate", argv[0], zip(argv[1:], TLS_FIELDS))


def _secret_files(what: str, name: str, targets: Iterable[tuple[str, str]], gid: int = -1) -> int:
    """The secret `name`'s JSON fields into files (secret_files.write_fields) with the node's
    credentials; "<what> of secret NAME written to FILES" when any was replaced."""
    cfg = boot.load_config()
    if not cfg:
        boot.log(f"no {boot.CONFIG}: no cloud to read {name} from")
        return 1
    written = write_fields(name, cloud_of(cfg).secret_string(name), list(targets), gid)
    if written:
        boot.log(f"{what} of secret {name} written to {', '.join(written)}")
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
    "journal-tls": journal_tls,
    "status": status,
    "prepare-image": lambda _argv: image.prepare_image(),
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: torchfleet-node " + "|".join(COMMANDS), file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
