"""The runtime's life: listen, load, size, warm, serve, drain, exit.

States: loading -> warming -> ready -> draining -> stopped (or failed). HTTP listens from the
start, so /livez answers and /readyz says 503 while the model loads and warms; /readyz is 200
only in `ready`. A drain (SIGTERM, SIGINT or a spot notice) turns /readyz and new predictions to
503 at once, lets in-flight requests finish, and stops within `drain_timeout_s`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from typing import Any, Callable, Iterator

import torch

from . import __version__, codec
from .batcher import Batcher
from .config import Config, ConfigError
from .interruption import SpotWatcher
from .metrics import Metrics
from .model import LoadedModel, ModelError, load
from .server import HTTPServer
from .warmup import SizingReport, buckets_up_to, load_sample, size_cap, warm_up

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, config: Config, module: Any = None) -> None:
        self.config = config
        self._module = module  # an nn.Module built by the caller (tests, embedding) instead of a file
        self.metrics = Metrics()
        self.state = "loading"
        self.loaded: LoadedModel | None = None
        self.batcher: Batcher | None = None
        self.sizing: SizingReport | None = None
        self.warmed: list[int] = []
        self.max_body_bytes = int(config.max_body_mb * 2**20)
        self.on_warmup_run: list[Callable[[int], None]] = []  # hooks: called with each warm-up batch size
        self._inflight = 0
        self._inflight_cond = threading.Condition()
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self.httpd: HTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self.spot = SpotWatcher(config.spot_watch, config.aws_metadata_url, config.alicloud_metadata_url,
                                config.spot_poll_interval_s, lambda notice: self.request_stop("spot interruption notice"))

    # --- state queries used by the HTTP layer ------------------------------------------------

    @property
    def port(self) -> int:
        assert self.httpd is not None
        return int(self.httpd.server_address[1])

    def is_ready(self) -> bool:
        return self.state == "ready"

    def retry_after_not_ready(self) -> str:
        return "5" if self.state in ("draining", "stopped") else "1"

    def liveness(self) -> tuple[bool, str]:
        """Alive unless the batch worker died or one batch has run longer than stuck_timeout_s."""
        if self.state == "failed":
            return False, "start-up failed"
        b = self.batcher
        if b is None:
            return True, ""
        if not b.is_alive() and self.state == "ready":
            return False, "the batch worker has stopped"
        since = b.busy_since
        if since is not None and time.monotonic() - since > self.config.stuck_timeout_s:
            return False, f"one batch has run for more than {self.config.stuck_timeout_s:.0f} s"
        return True, ""

    def describe(self) -> dict[str, Any] | None:
        if self.loaded is None:
            return None
        meta = self.loaded.metadata
        info = meta.as_dict()
        info.update(
            format=self.loaded.format,
            device=str(self.loaded.device),
            precision=self.config.precision,
            state=self.state,
            max_batch_size=self.batcher.cap if self.batcher else None,
            batch_cap_method=self.sizing.method if self.sizing else None,
            warmed_batch_sizes=list(self.batcher.buckets) if self.batcher else [],
            max_delay_ms=self.config.max_delay_ms,
            max_queue=self.batcher.max_queue if self.batcher else self.config.max_queue,
            torch_version=torch.__version__,
            runtime_version=__version__,
        )
        return info

    @contextlib.contextmanager
    def track_request(self) -> Iterator[None]:
        with self._inflight_cond:
            self._inflight += 1
        self.metrics.inflight.inc()
        try:
            yield
        finally:
            self.metrics.inflight.dec()
            with self._inflight_cond:
                self._inflight -= 1
                self._inflight_cond.notify_all()

    # --- lifecycle -------------------------------------------------------------------------

    def start_http(self) -> None:
        self.httpd = HTTPServer((self.config.host, self.config.port), self)
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                             name="torchfleet-http", daemon=True)
        self._http_thread.start()
        log.info("listening on http://%s:%d", self.config.host, self.port)

    def load_and_warm(self) -> None:
        """Load the model, size the batch cap, warm every bucket, then turn ready."""
        cfg = self.config
        t0 = time.perf_counter()
        self.loaded = load(cfg, self._module)
        self.metrics.model_load.set(time.perf_counter() - t0)
        log.info("loaded %s model %r on %s in %.2f s", self.loaded.format, self.loaded.metadata.name,
                 self.loaded.device, time.perf_counter() - t0)
        if self.stop_requested.is_set():
            return
        self.state = "warming"
        t1 = time.perf_counter()
        sample = load_sample(cfg.sample_input, self.loaded.metadata)
        pred = self.loaded.predictor
        self.sizing = size_cap(pred, sample, cfg.max_batch_size, cfg.memory_fraction, cfg.latency_budget_ms / 1000)
        hooks = self.on_warmup_run

        def on_run(b: int) -> None:
            for h in hooks:
                h(b)

        self.warmed = warm_up(pred, sample, buckets_up_to(self.sizing.cap), cfg.warmup_iterations, on_run)
        # Metrics attach after the self-test, so they count clients' requests only.
        self.batcher = Batcher(pred, self.warmed, cfg.max_delay_ms / 1000, cfg.max_queue,
                               wait_for_arrivals=cfg.batch_wait == "arrivals")
        self.metrics.batch_cap.set(self.batcher.cap)
        self.metrics.warmup.set(time.perf_counter() - t1)
        log.info("warmed batch sizes %s (%d runs each) in %.2f s", self.warmed, cfg.warmup_iterations,
                 time.perf_counter() - t1)
        self._self_test(sample)
        self.batcher.attach_metrics(self.metrics)
        self.batcher.start()
        if not self.stop_requested.is_set():
            self.state = "ready"
            self.metrics.ready.set(1)
            log.info("ready")

    def _self_test(self, sample: torch.Tensor) -> None:
        """One request through the real path (JSON decode, pad/run/split, encode) before ready:
        warms the code a first request runs besides the model, and fails start-up, not the first
        client, when the model's outputs cannot be answered (e.g. it returns a string)."""
        assert self.loaded is not None and self.batcher is not None
        meta = self.loaded.metadata
        body = json.dumps({"inputs": sample[0].tolist()}).encode()
        tensor, batched = codec.decode(body, "application/json", {}, meta.input_shape, meta.torch_dtype)
        codec.encode_json(self.batcher.run_now(tensor), batched)

    def start(self) -> None:
        """Listen, watch for spot notices, load and warm (blocking until ready)."""
        self.start_http()
        self.spot.start()
        try:
            self.load_and_warm()
        except BaseException:
            self.state = "failed"
            raise

    def request_stop(self, reason: str) -> None:
        """Begin draining now (thread- and signal-safe); `serve_until_stopped` finishes the job."""
        if self.state in ("draining", "stopped"):
            return
        self.stop_reason = reason
        self.state = "draining"
        self.metrics.ready.set(0)
        log.warning("draining: %s", reason)
        self.stop_requested.set()

    def drain(self, timeout_s: float) -> bool:
        """Wait until no request is in flight and the queue is empty; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._inflight_cond:
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("drain timeout: %d request(s) still in flight", self._inflight)
                    return False
                self._inflight_cond.wait(left)
        return True

    def close(self, worker_timeout_s: float = 5.0) -> None:
        self.spot.stop()
        if self.batcher is not None:
            self.batcher.close(timeout=worker_timeout_s)
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.state != "failed":
            self.state = "stopped"

    def serve_until_stopped(self) -> int:
        """The process's main loop: SIGTERM/SIGINT or a spot notice drain, then exit 0.

        Loading and warming run in a thread so a SIGTERM during a long warm-up still stops the
        process promptly (nothing is in flight then). A start-up failure returns 1.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.request_stop(signal.Signals(signum).name))
        self.start_http()
        self.spot.start()
        failure: list[BaseException] = []

        def warm() -> None:
            try:
                self.load_and_warm()
            except BaseException as exc:
                self.state = "failed"
                failure.append(exc)
                self.stop_requested.set()

        threading.Thread(target=warm, name="torchfleet-warmup", daemon=True).start()
        # Wake periodically so signal handlers run promptly on every Python version.
        while not self.stop_requested.wait(0.5):
            pass
        if failure:
            self.close()
            expected = isinstance(failure[0], (ConfigError, ModelError))  # the user's mistake: no traceback
            log.error("start-up failed: %s", failure[0], exc_info=None if expected else failure[0])
            return 1
        started = time.monotonic()
        clean = self.drain(self.config.drain_timeout_s)
        # After a clean drain the queue is empty and the worker stops at once; after a timeout
        # its batch is stuck, and waiting for it would break the drain_timeout_s promise.
        self.close(worker_timeout_s=5.0 if clean else 0.0)
        log.info("stopped after draining for %.2f s (%s)%s", time.monotonic() - started, self.stop_reason,
                 "" if clean else "; some requests were cut off")
        return 0
