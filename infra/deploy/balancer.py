"""The local fleet's load balancer: HAProxy from Debian, standing in for the ALB / CLB.

Contract. `Balancer(folder, backends)` owns one HAProxy process whose files live in `folder`:
- `render()` is the configuration: an HTTPS frontend (TLS 1.2 or newer, the certificate of a CA
  made for the run, `issue_certificates`) and an HTTP frontend that only redirects (301) to it,
  as the clouds' listeners do; one backend of `Backend`s health-checked on /readyz (two failures
  out, two passes in); the runtime API on a unix stats socket (`level admin`, mode 0600).
  `sticky_header` (an A/B that holds per client): requests go by a consistent hash of that
  header, weighted, so one value keeps its server while the weights hold (runtime weight
  changes still apply: hash-type consistent); a request without it goes round robin.
- `start()` checks the configuration (`haproxy -c`) and starts HAProxy as a daemon with a pid
  file (so it outlives the command that started it, as the demo's nodes do); `stop()` (or
  `stop(folder)`, without the rest) ends that pid and nothing else; `running()` says whether it
  is up.
- The runtime API, no reload: `set_weight(server, w)`, `drain(server)` (no new requests, those in
  flight finish: what a node leaving before a reclaim asks), `ready(server)` (back in rotation),
  `servers()` (status, weight, sessions of each server from `show stat`), `wait_status`.
Rollouts (weights shifted between servers) and the node agent's leave step (a `LocalLeave`,
torchfleet_agent.leave's Balancer protocol) build on these; nothing here is demo-only.
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from torchfleet_compat.problems import sentence

from infra.constants import HEALTH_PATH

BACKEND = "runtimes"
HEALTH_INTERVAL_MS = 1000
DEFAULT_WAIT_S = 30.0
PIDFILE, SOCKET = "haproxy.pid", "haproxy.sock"  # in the balancer's folder
HEADER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")


class BalancerError(RuntimeError):
    """HAProxy could not start, or its runtime API refused a command (the message says which)."""


@dataclass(frozen=True)
class Backend:
    name: str
    host: str
    port: int


@dataclass(frozen=True)
class Certificates:
    ca: Path  # what clients verify against
    pem: Path  # HAProxy's certificate chain and key, one file (0600)


def issue_certificates(
    folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> Certificates:
    """A throwaway CA and a server certificate for `hosts`, made once per folder (trustme)."""
    import trustme

    folder.mkdir(parents=True, exist_ok=True)
    ca_file, pem = folder / "ca.pem", folder / "haproxy.pem"
    if not (ca_file.exists() and pem.exists()):
        ca = trustme.CA(organization_name="torchfleet local fleet (throwaway)")
        cert = ca.issue_cert(*hosts)
        fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            for blob in cert.cert_chain_pems:
                f.write(blob.bytes())
            f.write(cert.private_key_pem.bytes())
        ca.cert_pem.write_to_path(str(ca_file))
    return Certificates(ca_file, pem)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Balancer:
    def __init__(
        self,
        folder: Path,
        backends: list[Backend],
        certificates: Certificates,
        https_port: int,
        http_port: int | None = None,
        bind: str = "127.0.0.1",
        sticky_header: str | None = None,
    ) -> None:
        if sticky_header is not None and not HEADER_RE.fullmatch(sticky_header):
            raise BalancerError(
                sentence("sticky_header", sticky_header, "a header name (letters, digits, -)")
            )
        self.sticky_header = sticky_header
        self.folder = folder
        self.backends = backends
        self.certificates = certificates
        self.https_port, self.http_port, self.bind = https_port, http_port, bind
        self.config = folder / "haproxy.cfg"
        self.socket = folder / SOCKET
        self.pidfile = folder / PIDFILE

    @property
    def endpoint(self) -> str:
        host = "localhost" if self.bind in ("127.0.0.1", "0.0.0.0") else self.bind
        return f"https://{host}:{self.https_port}"

    def render(self) -> str:
        servers = "\n".join(f"    server {b.name} {b.host}:{b.port} check" for b in self.backends)
        balance = (
            f"balance hdr({self.sticky_header})\n    hash-type consistent"
            if self.sticky_header
            else "balance roundrobin"
        )
        redirect = (
            f"""
frontend http
    bind {self.bind}:{self.http_port}
    http-request redirect scheme https code 301
"""
            if self.http_port
            else ""
        )
        return f"""# torchfleet local load balancer (infra/deploy/balancer.py): written, not edited
global
    stats socket {self.socket} mode 600 level admin
    pidfile {self.pidfile}
    ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets

defaults
    mode http
    option httplog
    timeout connect 5s
    timeout client 60s
    timeout server 120s
    timeout http-request 10s
    # a connection refused by a node is tried on another (a request is never sent twice)
    retries 2
    option redispatch

frontend https
    bind {self.bind}:{self.https_port} ssl crt {self.certificates.pem} ssl-min-ver TLSv1.2 alpn http/1.1
    http-request set-header X-Forwarded-Proto https
    default_backend {BACKEND}
{redirect}
backend {BACKEND}
    {balance}
    option httpchk GET {HEALTH_PATH}
    http-check expect status 200
    default-server inter {HEALTH_INTERVAL_MS}ms fall 2 rise 2
{servers}
"""

    # --- the process -------------------------------------------------------------------------

    def pid(self) -> int | None:
        return _pid(self.pidfile)

    def running(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return self.socket.exists()

    def start(self) -> None:
        """Write the configuration, check it, start HAProxy (a running one is replaced)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stop()
        self.config.write_text(self.render())
        checked = subprocess.run(
            ["haproxy", "-c", "-q", "-f", str(self.config)], capture_output=True, text=True
        )
        if checked.returncode != 0:
            raise BalancerError(f"haproxy -c refused {self.config}: {checked.stderr.strip()}")
        started = subprocess.run(
            ["haproxy", "-D", "-f", str(self.config)], capture_output=True, text=True, timeout=30
        )
        if started.returncode != 0:
            raise BalancerError(f"haproxy did not start: {started.stderr.strip()[-600:]}")
        deadline = time.monotonic() + 10
        while not self.running():
            if time.monotonic() > deadline:
                raise BalancerError(f"haproxy started but {self.socket} never appeared")
            time.sleep(0.05)

    def stop(self) -> bool:
        """End the HAProxy of this folder's pid file (and only it); True when one ran."""
        return stop(self.folder)

    # --- the runtime API -----------------------------------------------------------------------

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def _server_command(self, line: str) -> None:
        answer = self.command(line).strip()
        if answer:  # the runtime API answers a successful change with nothing
            raise BalancerError(f"haproxy refused {line!r}: {answer}")

    def set_weight(self, server: str, weight: int) -> None:
        """0..256; 0 takes the server out of the rotation without marking it down."""
        self._server_command(f"set weight {BACKEND}/{server} {int(weight)}")

    def drain(self, server: str) -> None:
        self._server_command(f"set server {BACKEND}/{server} state drain")

    def ready(self, server: str) -> None:
        self._server_command(f"set server {BACKEND}/{server} state ready")

    def servers(self) -> dict[str, dict[str, str]]:
        """name -> {status (UP, DOWN, DRAIN, MAINT, ...), weight, scur (open sessions), ...}"""
        text = self.command("show stat").lstrip("# ")
        out = {}
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("pxname") == BACKEND and row.get("svname") not in ("FRONTEND", "BACKEND"):
                out[row["svname"]] = {k: row.get(k, "") for k in ("status", "weight", "scur")}
        return out

    def wait_status(self, server: str, prefix: str, timeout_s: float = DEFAULT_WAIT_S) -> str:
        """Wait until `server`'s status starts with `prefix` (UP, DOWN, DRAIN); its status."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.servers().get(server, {}).get("status", "")
            if status.startswith(prefix):
                return status
            if time.monotonic() > deadline:
                raise BalancerError(
                    f"{BACKEND}/{server} is {status!r}, not {prefix} after {timeout_s:g} s"
                )
            time.sleep(0.1)


def stop(folder: Path) -> bool:
    """End the HAProxy whose pid file is in `folder` (and only it); True when one ran."""
    pidfile, sock = folder / PIDFILE, folder / SOCKET
    pid = _pid(pidfile)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    pidfile.unlink(missing_ok=True)
    sock.unlink(missing_ok=True)
    return True


def _pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class LocalLeave:
    """One local node's way out of the load balancer (torchfleet_agent.leave.Balancer)."""

    def __init__(self, balancer: Balancer, server: str) -> None:
        self.balancer, self.server = balancer, server

    def describe(self) -> str:
        return f"haproxy {BACKEND}/{self.server}"

    def leave(self) -> None:
        self.balancer.drain(self.server)
