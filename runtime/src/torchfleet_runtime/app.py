"""The process: the runtime, its HTTP edge and the spot watcher wired together, and the signals.

`Service(config)` composes `service.Runtime` (the model side) with the HTTP side: `edge_workers`
edge processes in front of this one (edges.py, edge.py: this process binds the socket and owns
the model), or with `edge_workers: 0` the same HTTP edge in this process (`server.build_http`);
neither side imports the other. `serve_until_stopped()` is `torchfleet-runtime serve`:
- HTTP listens at once (/livez 200, /readyz 503), the model loads and warms in a thread, so a
  SIGTERM during a long warm-up still stops the process promptly;
- SIGTERM / SIGINT / a spot notice: drain (answers carry Connection: close, idle keep-alive
  connections close, the drain ends when the admitted work is answered), then exit 0; after
  `drain_timeout_s` what is left is answered 503 (`Runtime.cut_off`) and the process still
  exits 0. A batch or a warm-up may then still be running inside torch: `unfinished_threads()`
  names them, and `cli` ends such a process with os._exit (see there), because interpreter
  shutdown under a thread in native code aborts (std::terminate, exit 134; 139 in containers);
- SIGHUP: read the API token file again (auth.py), then reload the model file beside the one
  serving (service.Runtime.reload); a failure is logged and counted and the old model keeps
  serving;
- a start-up failure exits 1.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from .auth import Tokens
from .config import Config, ConfigError, access_of
from .edges import EdgePool, edge_workers
from .errors import ApiError
from .httpd import HttpServer
from .interruption import SpotWatcher
from .model import ModelError
from .server import build_http
from .service import Runtime

log = logging.getLogger(__name__)

CUT_OFF_GRACE_S = 1.0  # longest wait for the 503s of a timed-out drain to be written
# threads that run torch (a replica's worker is torchfleet-batcher or torchfleet-batcher-<device>)
MODEL_THREADS = (
    "torchfleet-batcher",
    "torchfleet-warmup",
    "torchfleet-reload",
    "torchfleet-shadow",
)


def _on_gpu(config: Config) -> bool:
    """Whether the model runs on a GPU (edge_workers auto): a CUDA device asked for or found."""
    if config.device.startswith("cuda"):
        return True
    if config.device != "auto":
        return False
    import torch

    return bool(torch.cuda.is_available())


class Service:
    def __init__(self, config: Config, module: Any = None, shadow_module: Any = None) -> None:
        self.config = config
        self.runtime = Runtime(config, module, shadow_module)
        self.tokens = Tokens(config.api_token, config.api_token_file)
        workers = edge_workers(config, on_gpu=_on_gpu(config))
        self.http: HttpServer | EdgePool
        if workers:
            self.http = EdgePool(self.runtime, config, workers, self.runtime.reload, self.tokens)
        else:
            self.http = build_http(
                self.runtime, config, self.tokens, self.runtime.metrics.connections.set
            )
        self.spot = SpotWatcher(
            config.spot_watch,
            config.aws_metadata_url,
            config.alicloud_metadata_url,
            config.spot_poll_interval_s,
            self._on_spot_notice,
        )
        self._listening = False

    @property
    def port(self) -> int:
        return self.http.port

    def _on_spot_notice(self, notice: str) -> None:
        self.runtime.metrics.spot_notice.set(1)
        self.runtime.request_stop("spot interruption notice")

    def start_http(self) -> None:
        self.http.start()
        self._listening = True
        log.info(
            "listening on %s://%s:%d%s; predictions: %s",
            self.http.scheme,
            self.config.host,
            self.port,
            f" ({len(self.tokens)} API token(s) accepted)" if self.tokens.enabled else "",
            access_of(self.config),
        )

    def start(self) -> None:
        """Listen, watch for spot notices, load and warm (blocking until ready): tests, embedding."""
        self.start_http()
        self.spot.start()
        self.runtime.start()
        if isinstance(self.http, EdgePool):
            self.http.sync_state()  # every edge answers /readyz 200 once this returns

    def settle(self) -> None:
        """Once this returns, every request answered so far is counted and logged here (edge
        processes report their requests a moment after answering them)."""
        if isinstance(self.http, EdgePool):
            self.http.settle()

    def reload_in_background(self, reason: str) -> threading.Thread:
        def run() -> None:
            self.tokens.reload()
            if isinstance(self.http, EdgePool):
                self.http.tokens_changed()
            try:
                self.runtime.reload(reason)
            except ApiError as exc:  # reload() logged and counted a failed load already
                if exc.type != "reload_failed":
                    log.warning("reload (%s) not done: %s", reason, exc.message)

        t = threading.Thread(target=run, name="torchfleet-reload", daemon=True)
        t.start()
        return t

    def close(self, worker_timeout_s: float = 5.0) -> None:
        self.spot.stop()
        self.runtime.close(worker_timeout_s)
        if self._listening:
            self.http.stop()
            self._listening = False

    def serve_until_stopped(self) -> int:
        rt = self.runtime
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: rt.request_stop(signal.Signals(signum).name))
        signal.signal(signal.SIGHUP, lambda signum, frame: self.reload_in_background("SIGHUP"))
        self.start_http()
        self.spot.start()
        failure: list[BaseException] = []

        def warm() -> None:
            try:
                rt.load_and_warm()
            except BaseException as exc:
                rt.state = "failed"
                failure.append(exc)
                rt.stop_requested.set()

        threading.Thread(target=warm, name="torchfleet-warmup", daemon=True).start()
        # Wake periodically so signal handlers run promptly on every Python version.
        while not rt.stop_requested.wait(0.5):
            pass
        if failure:
            self.close()
            expected = isinstance(
                failure[0], (ConfigError, ModelError)
            )  # the user's mistake: no traceback
            log.error("start-up failed: %s", failure[0], exc_info=None if expected else failure[0])
            return 1
        started = time.monotonic()
        self.http.begin_closing()
        clean = rt.drain(self.config.drain_timeout_s)
        cut = 0
        if not clean:
            # What is left gets a 503 now; writing those answers takes the event loop
            # microseconds, so a short grace is enough before the connections close.
            cut = rt.cut_off(time.monotonic() - started)
            rt.drain(CUT_OFF_GRACE_S)
        # After a clean drain the queue is empty and the worker stops at once; after a timeout
        # its batch may run on, and waiting for it would break the drain_timeout_s promise.
        self.close(worker_timeout_s=5.0 if clean else 0.0)
        log.info(
            "stopped after draining for %.2f s (%s)%s",
            time.monotonic() - started,
            rt.stop_reason,
            "" if clean else f"; {cut} request(s) were cut off with 503",
        )
        return 0

    def unfinished_threads(self) -> list[str]:
        """This process's threads that may still be inside torch once serve_until_stopped() has
        returned: a batch that outlived the drain, a warm-up or a reload a signal cut short."""
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.name.startswith(MODEL_THREADS) and t.is_alive()
        )
