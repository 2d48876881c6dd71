"""How each server of the peer benchmark is started, probed and stopped.

Each server runs as its own process group (`start_new_session`), so the harness can measure the
whole tree and stop all of it; each peer runs from its own virtualenv under .cache/peers/<peer>/
(install.sh). Readiness is each server's own documented probe:
- torchfleet: GET /readyz 200 (the runtime's contract: warmed and not draining);
- LitServe: GET /health 200 ("200 when all workers are ready");
- Mosec: GET / 200 (its liveness path; the Rust front listens only once its workers connected);
- TorchServe: GET /ping "Healthy" *and* the model's workers READY on the management API: /ping
  alone is "Healthy" while no model is registered yet, and a prediction then gets 404.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchfleet_bench.local import free_port, loopback
from torchfleet_bench.peers import PEERS_DIR
from torchfleet_bench.peers.models import ModelFiles

APPS = PEERS_DIR / "apps"
ROOT = PEERS_DIR.parents[1]
PEERS_HOME = ROOT / ".cache" / "peers"
PEERS = ("mosec", "litserve", "torchserve")
SERVERS = ("torchfleet", *PEERS)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Settings:
    threads: str = "default"  # "default": leave torch's own; "1": OMP/MKL_NUM_THREADS=1
    max_batch: int = 16  # the peers' max batch size (torchfleet sizes its own)
    max_wait_ms: float = 10.0  # the peers' max wait for a batch to fill
    # more environment for the server (the GPU side by side: device, decode workers, edges)
    env: dict[str, str] = field(default_factory=dict)
    python: Path | None = None  # a peer's interpreter (default: its venv under .cache/peers/)


def venv_python(peer: str) -> Path:
    return PEERS_HOME / peer / "venv" / "bin" / "python"


def base_env(settings: Settings, extra_path: Path | None = None) -> dict[str, str]:
    """The same environment for every server: this one, minus any thread override unless the
    run asks for one thread."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    if settings.threads != "default":
        for var in THREAD_VARS:
            env[var] = settings.threads
    if extra_path:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings.env)
    return env


@dataclass
class Server:
    """One server process tree of one run."""

    name: str
    model: ModelFiles
    work: Path  # this run's own folder (logs, TorchServe's pid file, Mosec's sockets)
    settings: Settings
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    # -- per-server specifics ---------------------------------------------------------------

    @property
    def predict_path(self) -> str:
        return {
            "torchfleet": "/v1/predict",
            "litserve": "/predict",
            "mosec": "/inference",
            "torchserve": "/predictions/peer",
        }[self.name]

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        s = self.settings
        if self.name == "torchfleet":
            cli = Path(sys.executable).with_name("torchfleet-runtime")
            argv = (
                [str(cli)]
                if cli.exists()
                else [
                    sys.executable,
                    "-c",
                    "import sys; from torchfleet_runtime.cli import main; sys.exit(main())",
                ]
            )
            # its defaults: max_batch_size auto, its own thread settings, only where to listen
            return [
                *argv,
                "serve",
                "--model",
                str(self.model.model),
                "--port",
                str(self.port),
            ], base_env(s)
        py = s.python or venv_python(self.name)
        if not py.exists():
            raise RuntimeError(
                f"{self.name} is not installed: run benchmarks/peers/install.sh {self.name}"
            )
        env = base_env(s, py.parent)
        env.update(
            PEERS_MODEL=str(self.model.model),
            PEERS_MAX_BATCH=str(s.max_batch),
            PEERS_MAX_WAIT_MS=f"{s.max_wait_ms:g}",
        )
        if self.name == "litserve":
            return [str(py), str(APPS / "litserve_app.py"), str(self.port)], env
        if self.name == "mosec":
            # its unix sockets: a short path (AF_UNIX allows about 107 bytes; a deep work folder,
            # such as the device tool's output folder, exceeds it), removed in stop()
            ipc = Path(tempfile.mkdtemp(prefix="mosec-")) / "ipc"
            self.info["ipc_dir"] = str(ipc.parent)
            return [
                str(py),
                str(APPS / "mosec_app.py"),
                "--address",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--path",
                str(ipc),
            ], env
        # torchserve: the archive is built in prepare(); its pid file goes to TMPDIR
        self.info["management_port"] = mgmt = free_port()
        props = self.work / "config.properties"
        props.write_text(
            f"inference_address=http://127.0.0.1:{self.port}\n"
            f"management_address=http://127.0.0.1:{mgmt}\n"
            f"metrics_address=http://127.0.0.1:{free_port()}\n"
            "disable_token_authorization=true\n"
            "install_py_dep_per_model=false\n"
        )
        env["TMPDIR"] = str(self.work)
        return [
            str(py.parent / "torchserve"),
            "--start",
            "--foreground",
            "--ncs",
            "--model-store",
            str(self.work.parent / "torchserve-store"),
            "--models",
            "peer=peer.mar",
            "--ts-config",
            str(props),
            "--disable-token-auth",
        ], env

    def ready(self) -> bool:
        if self.name == "torchfleet":
            return loopback(self.port, "GET", "/readyz", timeout=1.0)[0] == 200
        if self.name == "litserve":
            return loopback(self.port, "GET", "/health", timeout=1.0)[0] == 200
        if self.name == "mosec":
            return loopback(self.port, "GET", "/", timeout=1.0)[0] == 200
        status, body = loopback(self.port, "GET", "/ping", timeout=1.0)
        if status != 200 or b'"Healthy"' not in body:
            return False
        status, body = loopback(self.info["management_port"], "GET", "/models/peer", timeout=1.0)
        if status != 200:
            return False
        desc = json.loads(body)[0]
        ready = [w for w in desc.get("workers", []) if w.get("status") == "READY"]
        return len(ready) >= max(int(desc.get("minWorkers", 1)), 1)

    # -- common lifecycle -------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The started server's process id."""
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        argv, env = self._launch()
        self.info["argv"] = argv
        self._log = open(self.work / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=self.work,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float) -> float:
        """Seconds from spawn to the server's own probe saying ready (polled every 20 ms)."""
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if self.ready():
                return time.monotonic() - self.started
            if time.monotonic() - self.started > timeout:
                raise RuntimeError(f"{self.name} not ready after {timeout:g} s: {self.tail()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """SIGTERM to the whole group; SIGKILL what is left after `timeout`. The figure is the
        time until the whole tree is gone (a launcher may exit before the JVM or workers)."""
        if self.proc is None:
            return {}
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        root_s = time.monotonic() - t0
        while _group_alive(self.proc.pid) and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        gone_s = time.monotonic() - t0
        killed = rc is None or _group_alive(self.proc.pid)
        if killed:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        self._log.close()
        if "ipc_dir" in self.info:
            shutil.rmtree(self.info["ipc_dir"], ignore_errors=True)
        return {
            "exit_code": rc,
            "sigterm_to_exit_s": round(gone_s, 3),
            "root_exit_s": round(root_s, 3),
            "killed": killed,  # True: something outlived `timeout` and got SIGKILL
        }

    def tail(self, n: int = 2500) -> str:
        with contextlib.suppress(OSError):
            self._log.flush()
            return (self.work / "server.log").read_text(errors="replace")[-n:]
        return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still counts for killpg; the harness reaps only its direct child
    return any(_pgid(p) == pgid and not _zombie(p) for p in _pids())


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat_fields(pid: int) -> list[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def _pgid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[2]) if f else None


def _zombie(pid: int) -> bool:
    f = _stat_fields(pid)
    return not f or f[0] == "Z"


def prepare_torchserve(model: ModelFiles, work: Path, settings: Settings) -> Path:
    """The model archive (.mar) with the handler, common.py and model-config.yaml: built once per
    model and batch setting, before any timing."""
    store = work / "torchserve-store"
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    cfg = work / "model-config.yaml"
    # TorchServe's batching lives in the archive's model config (docs/configuration.md,
    # "config model"); workers stay at TorchServe's default (one per core on CPU).
    cfg.write_text(f"batchSize: {settings.max_batch}\nmaxBatchDelay: {int(settings.max_wait_ms)}\n")
    archiver = venv_python("torchserve").with_name("torch-model-archiver")
    subprocess.run(
        [
            str(archiver),
            "--model-name",
            "peer",
            "--version",
            "1.0",
            "--serialized-file",
            str(model.model),
            "--handler",
            str(APPS / "torchserve_handler.py"),
            "--extra-files",
            str(APPS / "common.py"),
            "--config-file",
            str(cfg),
            "--export-path",
            str(store),
            "--force",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return store / "peer.mar"
