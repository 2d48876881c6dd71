"""What the benchmarks ask of the machine they run servers on: a free loopback port, one request
to a server there, and a process's own CPU time (so a figure is the server's cost, whatever the
client and the neighbours use). Linux only (/proc). The tree of a server with workers:
peers/proctree.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from infra.client import request


def free_port() -> int:
    """A port free on 127.0.0.1 now (the kernel picks it, so parallel runs never collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback(
    port: int, method: str, path: str, body: bytes | None = None, timeout: float = 5.0
) -> tuple[int | None, bytes]:
    """(status, body) of one request to 127.0.0.1:`port` on a fresh connection (a body is sent
    as JSON); (None, b"") when nothing answers."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    status, data, _ = request(method, f"http://127.0.0.1:{port}{path}", body, headers, timeout)
    return status, data


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
