"""HEALTHCHECK of the torchfleet-runtime image: exit 0 when GET /readyz answers 200, else 1.

The address is resolved the way the server resolved it, by the runtime's own code: the serving
process's flags (its /proc/PID/cmdline: PID 1, or a child of an init such as `--init`) parsed by
the runtime's CLI parser, its environment (/proc/PID/environ) and config file through
`load_config`. So `podman run IMAGE --port 9000` or `-e TORCHFLEET_PORT=9000` is checked on
9000 without a second setting. A wildcard bind address is probed on loopback, over HTTPS when
the runtime serves it (trusting exactly its tls_cert_file, as `diagnose` does).

Runs on the image's Python (3.8+), stdlib plus the runtime package; one line of output goes to
the container engine's health log.
"""

from __future__ import annotations

import http.client
import os
import sys
from pathlib import Path

TIMEOUT_S = 4.0  # below the image's HEALTHCHECK --timeout
WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def serving_process() -> tuple[list[str], dict[str, str]] | None:
    """(arguments after `serve`, environment) of the `torchfleet-runtime serve` process."""
    pids = sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)
    for pid in pids:
        try:
            argv = Path("/proc", pid, "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if os.path.basename(arg) == "torchfleet-runtime" and argv[i + 1] == "serve":
                try:
                    raw = Path("/proc", pid, "environ").read_bytes().decode(errors="replace")
                    env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
                except OSError:  # another user's process: our own environment is the image's
                    env = dict(os.environ)
                return [a for a in argv[i + 2 :] if a != ""], env
    return None


def main() -> int:
    found = serving_process()
    if found is None:
        print("unhealthy: no `torchfleet-runtime serve` process")
        return 1
    argv, env = found
    from torchfleet_runtime.cli import build_parser
    from torchfleet_runtime.config import FIELDS, ConfigError, load_config
    from torchfleet_runtime.diagnose import pinned_context

    args = build_parser().parse_args(["serve", *argv])
    try:
        config, _ = load_config(
            {k: getattr(args, k) for k in FIELDS}, env=env, config_file=args.config
        )
    except ConfigError as exc:
        print(f"unhealthy: {exc}")
        return 1
    host = WILDCARD.get(config.host, config.host)
    if config.tls_cert_file:
        scheme = "https"
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, config.port, timeout=TIMEOUT_S, context=pinned_context(config.tls_cert_file)
        )
    else:
        scheme = "http"
        conn = http.client.HTTPConnection(host, config.port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        body = resp.read(200).decode(errors="replace").strip()
    except OSError as exc:
        print(f"unhealthy: {scheme}://{host}:{config.port}/readyz: {exc}")
        return 1
    finally:
        conn.close()
    verdict = "healthy" if resp.status == 200 else "unhealthy"
    print(f"{verdict}: {scheme}://{host}:{config.port}/readyz {resp.status} {body}")
    return 0 if resp.status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
