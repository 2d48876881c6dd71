"""The runtime behind the HTTP layer: one small API (`predict`, `status`, `reload`) and its life.

States: loading -> warming -> ready -> draining -> stopped (or failed). /readyz is 200 only in
`ready`; a reload keeps `ready` throughout.

- `predict(request_id)` begins one prediction and returns a `PredictCall`: `submit` decodes the
  body and admits it to the batcher (an `ApiError` for every refusal), a done callback fires in
  the batcher's thread when the model has run, `answer` encodes it (in the caller's thread, so
  encoding never holds up the model), `finish` records the status the client got. Metrics,
  per-request logs and drain accounting live here, not in the HTTP layer.
- `status()`: state, readiness, liveness and (detail=True) the model card of /v1/model;
  `metrics_text()`: the Prometheus exposition.
- `reload(reason)`: loads the configured model file (and sidecar) again beside the one serving,
  sizes and warms it, self-tests it, then swaps it in atomically; the old batcher finishes what
  it holds and stops. A model that fails leaves the old one serving: `ApiError` 422 naming why,
  an error log line, `torchfleet_reloads_total{result="failed"}`. One reload at a time (409).
- Drain (SIGTERM, SIGINT, a spot notice): /readyz and new predictions 503 with Connection:
  close at once; those 503s are not in-flight work. A prediction is admitted once its headers
  are accepted (its body may still be arriving). `drain()` returns as soon as every admitted
  prediction has been answered, or after `drain_timeout_s`; then `cut_off()` answers what is
  left 503 and drops the queue (the batch running then may go on inside torch: see app).
Threads: torch gets `torch_threads` intra-op threads (auto: one per CPU this process may use:
the affinity mask and the cgroup CPU quota, see cpus.py; under load the batcher may run one fewer
when that serves more, see threadtune.py) and `torch_interop_threads` (auto: 1),
set once before the first model loads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from . import __version__, codec, compat
from .batcher import Batcher, BatchInfo, OutOfMemory, QueueFull, Request, Stopped, TooLarge
from .config import Config, ConfigError
from .cpus import usable_cpus
from .errors import ApiError
from .logs import BatchSummary
from .metrics import Metrics
from .model import LoadedModel, ModelError, load
from .optimize import optimize
from .tensors import buckets_up_to, non_finite
from .threadtune import ThreadTuner
from .warmup import SizingReport, load_sample, size_cap, warm_up

log = logging.getLogger(__name__)
reqlog = logging.getLogger("torchfleet_runtime.request")


@dataclass
class Slot:
    """One loaded, sized, warmed model with its batcher: what a reload builds and swaps in."""

    loaded: LoadedModel
    batcher: Batcher
    sizing: SizingReport
    load_s: float
    warm_s: float
    meta_key: tuple[Any, ...] = field(default=())

    @property
    def version(self) -> str:
        return self.loaded.version


def configure_threads(config: Config) -> tuple[int, int]:
    """Intra- and inter-op thread counts for torch, set once per process (inter-op can only be
    set before any parallel work; a second runtime in one process keeps the first setting)."""
    intra = (
        config.torch_threads or usable_cpus()
    )  # auto: the affinity mask and the cgroup CPU quota
    interop = config.torch_interop_threads or 1
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(interop)
    except RuntimeError:
        log.debug("torch inter-op threads already fixed at %d", torch.get_num_interop_threads())
    return torch.get_num_threads(), torch.get_num_interop_threads()


class Runtime:
    def __init__(self, config: Config, module: Any = None) -> None:
        self.config = config
        self._module = (
            module  # an nn.Module built by the caller (tests, embedding) instead of a file
        )
        self.metrics = Metrics()
        self.state = "loading"
        self._slot: Slot | None = None
        self.max_body_bytes = int(config.max_body_mb * 2**20)
        self._admitted = (
            0  # predictions admitted to a batcher and not yet answered (the drain waits for them)
        )
        self._admitted_cond = threading.Condition()
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self._reload_lock = threading.Lock()
        self._reloads = {"ok": 0, "failed": 0}
        self._last_reload: dict[str, Any] | None = None
        self._summary = BatchSummary(log, config.log_summary_s)
        self._stage = self.metrics.stage_of if config.stage_timing else None
        self.threads = (0, 0)

    # --- introspection (tests, the model card) ------------------------------------------------

    @property
    def loaded(self) -> LoadedModel | None:
        return self._slot.loaded if self._slot else None

    @property
    def batcher(self) -> Batcher | None:
        return self._slot.batcher if self._slot else None

    @property
    def sizing(self) -> SizingReport | None:
        return self._slot.sizing if self._slot else None

    @property
    def version(self) -> str | None:
        return self._slot.version if self._slot else None

    # --- the API of the HTTP layer -----------------------------------------------------------

    def predict(self, request_id: str) -> PredictCall:
        return PredictCall(self, request_id)

    def status(self, detail: bool = False) -> dict[str, Any]:
        alive, why = self._liveness()
        out: dict[str, Any] = {
            "state": self.state,
            "ready": self.state == "ready",
            "alive": alive,
            "reason": why,
            "retry_after": self._retry_after(),
        }
        if detail:
            out["model"] = self._describe()
        return out

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def reload(self, reason: str) -> dict[str, Any]:
        """Load, size, warm and swap in the configured model file; blocking (seconds)."""
        if not self._reload_lock.acquire(blocking=False):
            raise ApiError(409, "reload_in_progress", "a reload is already running; wait for it")
        try:
            return self._reload(reason)
        finally:
            self._reload_lock.release()

    # --- state -------------------------------------------------------------------------------

    def _retry_after(self) -> int:
        return 5 if self.state in ("draining", "stopped") else 1

    def _liveness(self) -> tuple[bool, str]:
        """Alive unless start-up failed, the batch worker died, or one batch ran past stuck_timeout_s."""
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

    def _describe(self) -> dict[str, Any] | None:
        slot = self._slot
        if slot is None:
            return None
        info = slot.loaded.metadata.as_dict()
        info.update(
            model_version=slot.version,
            format=slot.loaded.format,
            device=str(slot.loaded.device),
            precision=self.config.precision,
            optimization=slot.loaded.optimization,
            state=self.state,
            max_batch_size=slot.batcher.cap,
            batch_cap_method=slot.sizing.method,
            warmed_batch_sizes=list(slot.batcher.buckets),
            max_delay_ms=self.config.max_delay_ms,
            max_queue=slot.batcher.max_queue,
            torch_threads=slot.batcher.threads or self.threads[0],
            torch_threads_auto=(
                None if slot.batcher.thread_tuner is None else slot.batcher.thread_tuner.last
            ),
            torch_interop_threads=self.threads[1],
            torch_version=torch.__version__,
            runtime_version=__version__,
            reloads={**self._reloads, "last": self._last_reload},
        )
        return info

    # --- building a slot ---------------------------------------------------------------------

    def _build_slot(self, held_bytes: int = 0) -> Slot:
        """Load, size, warm and self-test a model in a new thread that then serves it (the
        batcher's worker: see Batcher.serve_here); returns once it is ready to take requests."""
        box: dict[str, Any] = {}
        built = threading.Event()

        def build_then_serve() -> None:
            try:
                box["slot"] = self._build_here(held_bytes)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
                return
            finally:
                built.set()
            box["slot"].batcher.serve_here()

        threading.Thread(target=build_then_serve, name="torchfleet-batcher", daemon=True).start()
        built.wait()
        if "error" in box:
            raise box["error"]
        return box["slot"]

    def _build_here(self, held_bytes: int) -> Slot:
        cfg = self.config
        t0 = time.perf_counter()
        loaded = load(cfg, self._module)
        load_s = time.perf_counter() - t0
        log.info(
            "loaded %s model %r version %s on %s in %.2f s",
            loaded.format,
            loaded.metadata.name,
            loaded.version,
            loaded.device,
            load_s,
        )
        if self.state == "loading":
            self.state = "warming"
        t1 = time.perf_counter()
        sample = load_sample(cfg.sample_input, loaded.metadata)
        loaded = optimize(loaded, sample, cfg.optimize)
        pred = loaded.predictor
        sizing = size_cap(
            pred,
            sample,
            cfg.max_batch_size,
            cfg.memory_fraction,
            cfg.latency_budget_ms / 1000,
            held_bytes,
        )
        # the fastest run of each bucket, sizing's (CPU) or warm-up's: the batcher's costs
        seconds = dict(sizing.measurements) if sizing.method == "latency" else {}
        warmed = warm_up(
            pred, sample, buckets_up_to(sizing.cap), cfg.warmup_iterations, sizing.runs, seconds
        )
        batcher = Batcher(
            pred,
            warmed,
            cfg.max_delay_ms / 1000,
            cfg.max_queue,
            wait_for_arrivals=cfg.batch_wait == "arrivals",
            bucket_seconds={b: seconds[b] for b in warmed if b in seconds},
            thread_tuner=self._thread_tuner(loaded),
        )
        self._self_test(loaded, batcher, sample)
        warm_s = time.perf_counter() - t1
        log.info("warmed batch sizes %s in %.2f s", warmed, warm_s)
        meta = loaded.metadata
        return Slot(loaded, batcher, sizing, load_s, warm_s, (meta.input_shape, meta.dtype))

    def _thread_tuner(self, loaded: LoadedModel) -> ThreadTuner | None:
        """torch_threads auto on a CPU model with 2+ CPUs: one per CPU or one fewer, as measured
        under the load (threadtune.py); a set count, or a GPU model, runs as configured."""
        if self.config.torch_threads is not None or loaded.device.type != "cpu":
            return None
        return ThreadTuner(self.threads[0]) if self.threads[0] >= 2 else None

    def _self_test(self, loaded: LoadedModel, batcher: Batcher, sample: torch.Tensor) -> None:
        """One request through the real path (JSON decode, pad/run/split, encode) before the slot
        serves: warms the code a first request runs besides the model, and fails start-up (or the
        reload), not the first client, when the model's outputs cannot be answered."""
        meta = loaded.metadata
        body = codec.dumps({"inputs": sample[0].tolist()})
        tensor, batched = codec.decode(
            body, "application/json", {}, meta.input_shape, meta.torch_dtype
        )
        outputs = batcher.run_now(tensor)
        non_finite(
            outputs
        )  # the check a JSON answer runs (random inputs may well give NaN: not a failure)
        try:
            codec.encode_json(outputs, batched, non_finite_as_null=True)
        except ApiError as exc:
            raise ModelError(f"the self-test answer failed: {exc.message}") from None

    def _summarise(self, version: str, info: BatchInfo) -> None:
        self._summary.add(info.size, info.bucket, info.reason, info.model_s, version)

    def _activate(self, slot: Slot) -> None:
        slot.batcher.attach_metrics(self.metrics)
        slot.batcher.on_batch.append(functools.partial(self._summarise, slot.version))
        m = self.metrics
        m.model_load.set(slot.load_s)
        m.warmup.set(slot.warm_s)
        m.set_model(
            slot.version,
            slot.loaded.metadata.name,
            slot.loaded.format,
            str(slot.loaded.device),
            self.config.precision,
        )
        self._slot = slot  # the swap: one reference assignment, atomic for every reader

    # --- lifecycle -----------------------------------------------------------------------------

    def load_and_warm(self) -> None:
        """Set the thread counts, load the model, size the batch cap, warm every bucket, turn ready."""
        self.threads = configure_threads(self.config)  # intra-op: torch applies it in every thread
        log.info("torch threads: %d intra-op, %d inter-op", *self.threads)
        slot = self._build_slot()
        if self.stop_requested.is_set():
            slot.batcher.close(0)
            return
        self._activate(slot)
        if not self.stop_requested.is_set():
            self.state = "ready"
            self.metrics.ready.set(1)
            log.info("ready", extra={"fields": {"model_version": slot.version}})

    def start(self) -> None:
        """Load and warm, blocking until ready (tests, embedding; `app` runs it in a thread)."""
        try:
            self.load_and_warm()
        except BaseException:
            self.state = "failed"
            raise

    def _reload(self, reason: str) -> dict[str, Any]:
        old = self._slot
        if self.state != "ready" or old is None:
            raise ApiError(503, "not_ready", f"the runtime is {self.state}; nothing to reload yet")
        log.info(
            "reload (%s): loading %s beside version %s",
            reason,
            self.config.model or "the module",
            old.version,
        )
        started = time.perf_counter()
        held = 0
        if old.loaded.device.type == "cuda":
            held = int(torch.cuda.memory_allocated(old.loaded.device))
        try:
            new = self._build_slot(held_bytes=held)
        except Exception as exc:  # any failure of the new model: the old one keeps serving
            why = (
                str(exc)
                if isinstance(exc, (ModelError, ConfigError))
                else f"{type(exc).__name__}: {exc}"
            )
            self._record_reload("failed", started, old.version, None, why)
            log.error(
                "reload failed, version %s keeps serving: %s",
                old.version,
                why,
                exc_info=None if isinstance(exc, (ModelError, ConfigError)) else exc,
            )
            compat.cuda_empty_cache()
            raise ApiError(
                422,
                "reload_failed",
                f"the new model was not loaded ({why}); version {old.version} keeps serving",
            ) from None
        if self.state != "ready":  # a drain began while the new model warmed: keep the old one
            new.batcher.close(0)
            raise ApiError(
                503, "not_ready", "the runtime began draining during the reload", close=True
            )
        self._activate(new)
        previous = old.version
        old.batcher.close(timeout=self.config.stuck_timeout_s)  # finishes what it holds
        del old
        compat.cuda_empty_cache()
        result = self._record_reload("ok", started, previous, new.version, None)
        log.info(
            "reload done: version %s serving (was %s) after %.2f s",
            new.version,
            result["previous_version"],
            result["seconds"],
            extra={"fields": result},
        )
        return result

    def _record_reload(
        self, result: str, started: float, previous: str, version: str | None, error: str | None
    ) -> dict[str, Any]:
        self._reloads[result] += 1
        self.metrics.reloads.labels(result=result).inc()
        self._last_reload = {
            "result": result,
            "at": round(time.time(), 3),
            "seconds": round(time.perf_counter() - started, 3),
            "previous_version": previous,
            "model_version": version,
            "error": error,
        }
        return dict(self._last_reload)

    def request_stop(self, reason: str) -> None:
        """Begin draining now (thread- and signal-safe); `app` finishes the job."""
        if self.state in ("draining", "stopped"):
            return
        self.stop_reason = reason
        self.state = "draining"
        self.metrics.ready.set(0)
        log.warning("draining: %s", reason)
        self.stop_requested.set()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every admitted prediction has been answered; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._admitted_cond:
            while self._admitted > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("drain timeout: %d request(s) still in flight", self._admitted)
                    return False
                self._admitted_cond.wait(left)
        return True

    def cut_off(self, waited_s: float) -> int:
        """After a drain that timed out: answer every prediction still admitted 503 not_ready
        with Connection: close at once (a client can retry elsewhere instead of reading a
        reset), drop the batcher's queue and stop its worker after the batch it is running.
        Returns how many requests were cut off."""
        slot = self._slot
        if slot is None:
            return 0
        return slot.batcher.abort(
            ApiError(
                503,
                "not_ready",
                f"the runtime stopped: the drain ended after {waited_s:.1f} s (drain_timeout_s) "
                "before this prediction was answered; retry it",
                5,
                close=True,
            )
        )

    def close(self, worker_timeout_s: float = 5.0) -> None:
        if self._slot is not None:
            self._slot.batcher.close(timeout=worker_timeout_s)
        if self.state != "failed":
            self.state = "stopped"

    # --- used by PredictCall ---------------------------------------------------------------------

    def _admit(self, delta: int) -> None:
        with self._admitted_cond:
            self._admitted += delta
            if self._admitted == 0:
                self._admitted_cond.notify_all()


class PredictCall:
    """One prediction from arrival to the last byte written (see the module docstring)."""

    __slots__ = (
        "rt",
        "request_id",
        "arrived",
        "slot",
        "request",
        "batched",
        "timings",
        "admitted",
        "_expecting",
        "_finished",
        "_status",
    )

    def __init__(self, rt: Runtime, request_id: str) -> None:
        self.rt = rt
        self.request_id = request_id
        self.arrived = time.perf_counter()
        self.slot: Slot | None = rt._slot
        self.request: Request | None = None
        self.batched = False
        self.timings: dict[str, float] = {}
        self.admitted = False
        self._expecting = False
        self._finished = False
        self._status = 0
        rt.metrics.inflight.inc()

    @property
    def version(self) -> str | None:
        return self.slot.version if self.slot else None

    def check_ready(self) -> None:
        """Refuse at once (before the body is read) when not serving."""
        rt = self.rt
        if rt.state != "ready" or self.slot is None:
            draining = rt.state in ("draining", "stopped")
            raise ApiError(
                503, "not_ready", f"the runtime is {rt.state}", rt._retry_after(), close=draining
            )

    def expect(self) -> None:
        """Headers are in (`check_ready` passed) and the body is on its way: a forming batch may
        wait for it, and from now on the drain does too: a request accepted before SIGTERM is
        answered in full even when its last bytes arrive during the drain."""
        if self.slot is not None and not self._expecting:
            self.slot.batcher.expect()
            self._expecting = True
        self._admit()

    @property
    def _accepted_before_drain(self) -> bool:
        """Admitted (headers accepted) before a drain that is now running: still served."""
        return self.admitted and self.rt.state == "draining"

    def _admit(self) -> None:
        if not self.admitted:
            self.admitted = True
            self.rt._admit(1)

    def _unexpect(self) -> None:
        if self._expecting and self.slot is not None:
            self._expecting = False
            self.slot.batcher.unexpect()

    def submit(
        self, body: bytes | bytearray, content_type: str, headers: Mapping[str, str]
    ) -> None:
        """Decode and admit; raises ApiError for every refusal."""
        rt = self.rt
        try:
            if not self._accepted_before_drain:
                self.check_ready()
            slot = self.slot
            assert slot is not None
            meta = slot.loaded.metadata
            t0 = time.perf_counter()
            tensor, self.batched = codec.decode(
                body,
                content_type,
                headers,
                meta.input_shape,
                meta.torch_dtype,
                not rt.config.allow_non_finite_inputs,
            )
            self.timings["decode"] = time.perf_counter() - t0
        except BaseException:
            self._unexpect()
            raise
        expected, self._expecting = self._expecting, False
        while True:
            try:
                self.request = slot.batcher.submit(tensor, expected=expected)
                break
            except QueueFull as exc:
                raise ApiError(503, "queue_full", str(exc), exc.retry_after_s) from None
            except TooLarge as exc:
                raise ApiError(413, "too_many_instances", str(exc)) from None
            except Stopped:
                current = rt._slot
                if (
                    (rt.state == "ready" or self._accepted_before_drain)
                    and current is not None
                    and current is not slot
                    and current.meta_key == slot.meta_key
                ):
                    slot = self.slot = current  # a reload swapped models between decode and submit
                    expected = False
                    continue
                raise ApiError(503, "not_ready", "the runtime is draining", 5, close=True) from None
        self._admit()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        assert self.request is not None
        self.request.add_done_callback(fn)

    def answer(self, accept: str) -> tuple[bytes, str, dict[str, str]]:
        """(body, content type, headers) of the 200; raises ApiError when the model failed."""
        assert self.request is not None and self.slot is not None
        try:
            outputs = self.request.result(0)
        except OutOfMemory as exc:
            raise ApiError(503, "out_of_memory", str(exc), 5) from None
        except ApiError:
            raise
        except Exception as exc:  # the model failed: the client did nothing wrong
            raise ApiError(500, "model_error", f"{type(exc).__name__}: {exc}") from None
        t0 = time.perf_counter()
        if "application/octet-stream" in accept and "application/json" not in accept:
            body, headers = codec.encode_raw(outputs, self.batched)
            ctype = "application/octet-stream"
        else:
            body = codec.encode_json(
                outputs, self.batched, self.rt.config.non_finite_outputs == "null"
            )
            ctype, headers = "application/json", {}
        t = self.timings
        t["encode"] = time.perf_counter() - t0
        t["queue"] = self.request.queue_s
        t["model"] = self.request.model_s
        if self.rt._stage is not None:
            headers["Server-Timing"] = (
                f"decode;dur={t['decode'] * 1000:.3f}, queue;dur={t['queue'] * 1000:.3f}, "
                f"model;dur={t['model'] * 1000:.3f}, encode;dur={t['encode'] * 1000:.3f}"
            )
        return body, ctype, headers

    def wrote(self, write_s: float) -> None:
        """The answer's bytes were handed to the socket in `write_s`."""
        if self.rt._stage is not None and self._status == 200:
            self.rt._stage["write"].observe(write_s)

    def finish(self, status: int, error: ApiError | None = None) -> None:
        """The answer is about to be written (or the client is gone): count it, log it, release it."""
        if self._finished:
            return
        self._finished = True
        self._status = status
        rt = self.rt
        self._unexpect()
        m = rt.metrics
        m.requests.labels(code=str(status)).inc()
        total = time.perf_counter() - self.arrived
        if status == 200:
            m.request_duration.observe(total)
            m.last_request.set(time.time())
            stage = rt._stage
            if stage is not None:
                t = self.timings
                stage["decode"].observe(t.get("decode", 0.0))
                stage["queue"].observe(t.get("queue", 0.0))
                stage["encode"].observe(t.get("encode", 0.0))
        m.inflight.dec()
        if self.admitted:
            rt._admit(-1)
        if error is not None and status >= 500:
            reqlog.error(
                "%s %s: %s",
                status,
                error.type,
                error.message,
                extra={
                    "request_id": self.request_id,
                    "fields": {"status": status, "type": error.type},
                },
            )
        elif error is not None:
            reqlog.info(
                "%s %s: %s",
                status,
                error.type,
                error.message,
                extra={
                    "request_id": self.request_id,
                    "fields": {"status": status, "type": error.type},
                },
            )
        elif reqlog.isEnabledFor(logging.DEBUG):
            fields = {
                "status": status,
                "ms": round(total * 1000, 3),
                "model_version": self.version,
                **{k + "_ms": round(v * 1000, 3) for k, v in self.timings.items()},
            }
            reqlog.debug(
                "predict %s", status, extra={"request_id": self.request_id, "fields": fields}
            )


__all__ = ["ApiError", "BatchInfo", "PredictCall", "Runtime", "Slot", "configure_threads"]
