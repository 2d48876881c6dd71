"""How the controller reaches a node's runtime: an SSH tunnel, the way Ansible logs in.

An instances-mode node serves on its private address and the stack opens only SSH, to the
admin CIDRs (infra/), so the readiness wait, the smoke prediction and `status` reach the
runtime through `ssh -L 127.0.0.1:<free port>:127.0.0.1:<service port>` with the host's own
connection variables from the inventory (ansible_host, ansible_port, ansible_user, the key,
ansible_ssh_common_args). The demo's container nodes are reached the same way. What goes through
a tunnel is infra.client's (the one client of a node's runtime)."""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infra.deploy.stage import StageError

TUNNEL_TIMEOUT_S = 30.0


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the kernel picks it, so nothing collides on a fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class SshTarget:
    host: str  # inventory name
    address: str
    port: int
    user: str | None
    key_file: str | None
    common_args: tuple[str, ...]

    @classmethod
    def from_hostvars(
        cls, name: str, hv: dict[str, Any], private_key: str | None = None
    ) -> SshTarget:
        return cls(
            host=name,
            address=str(hv.get("ansible_host") or name),
            port=int(hv.get("ansible_port") or 22),
            user=hv.get("ansible_user"),
            key_file=private_key or hv.get("ansible_ssh_private_key_file"),
            common_args=tuple(shlex.split(str(hv.get("ansible_ssh_common_args") or ""))),
        )

    def command(self, local_port: int, remote_port: int) -> list[str]:
        cmd = [
            "ssh",
            "-N",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=15",
            "-o",
            "ServerAliveInterval=15",
            *self.common_args,
            "-p",
            str(self.port),
            "-L",
            f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}",
        ]
        if self.key_file:
            cmd += ["-i", self.key_file, "-o", "IdentitiesOnly=yes"]
        return [*cmd, f"{self.user}@{self.address}" if self.user else self.address]


@contextlib.contextmanager
def tunnel(target: SshTarget, remote_port: int, stage: str) -> Iterator[str]:
    """Yields http://127.0.0.1:<port> forwarded to the node's 127.0.0.1:<remote_port>."""
    local = free_loopback_port()
    proc = subprocess.Popen(
        target.command(local, remote_port),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TUNNEL_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                err = (proc.stderr.read() if proc.stderr else "").strip()
                raise StageError(
                    stage,
                    f"the SSH tunnel to {target.host} ({target.address}:"
                    f"{target.port}) closed: {err or 'ssh exited ' + str(proc.returncode)}",
                    host=target.host,
                    fix="check that the host is up and that SSH from here is "
                    "allowed (torchfleet:admin_cidrs), then re-run",
                )
            try:
                with socket.create_connection(("127.0.0.1", local), timeout=1):
                    break  # ssh listens only once it is logged in (ExitOnForwardFailure)
            except OSError:
                if time.monotonic() > deadline:
                    raise StageError(
                        stage,
                        f"the SSH tunnel to {target.host} did not open in {TUNNEL_TIMEOUT_S:.0f} s",
                        host=target.host,
                        fix="check SSH to the host, then re-run",
                    ) from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{local}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
