"""The runtime behind the HTTP layer: one small API (`predict`, `status`, `reload`) and its life.

States: loading -> warming -> ready | degraded -> draining -> stopped (or failed). /readyz is
200 only in `ready`, which needs every replica (placement.py: one per device) warm and serving;
`degraded` means some replica failed (at start-up, or later: its device was lost, worker.py): the
node goes on serving predictions on the others, but /readyz answers 503 `degraded` naming them,
`torchfleet_degraded` is 1, `torchfleet_replica_ready{device}` 0, and /v1/model lists them, so a
node is never silently smaller. A start-up where no replica warms fails. A reload keeps `ready`
throughout.

- `predict(request_id)` begins one prediction: a `PredictCall` (predict.py).
- `status()`: state, readiness, liveness and (detail=True) the model card of /v1/model, with
  one entry per replica (device, CPU set, threads, state, recent batches, CUDA memory);
  `metrics_text()`: the Prometheus exposition.
- `reload(reason)`: loads the configured model file (and sidecar) again beside the one serving,
  on every replica (replicas.py: sized, warmed, self-tested), then swaps it in atomically; the
  old batcher finishes what it holds and stops its workers. A model that fails on any replica
  leaves the old one serving: `ApiError` 422 naming why, an error log line,
  `torchfleet_reloads_total{result="failed"}`. One reload at a time (409). A degraded node may
  reload: one that brings every replica back is ready again. A reload whose model sustains
  another batch cap logs the change (a warning: before, after, the instances/s at the new cap)
  and its record in /v1/model's `reloads.last.batch_cap` says both; /v1/model's
  `capacity_items_per_s` is what the batcher's `capacity` measured.
- Drain (SIGTERM, SIGINT, a spot notice): /readyz and new predictions 503 with Connection:
  close at once; those 503s are not in-flight work. A prediction is admitted once its headers
  are accepted (its body may still be arriving). `drain()` returns as soon as every admitted
  prediction has been answered, whichever replica runs it, or after `drain_timeout_s`; then
  `cut_off()` answers what is left 503 and drops the queue (the batches running then may go on
  inside torch: see app).
Threads: torch gets `torch_threads` intra-op threads (auto: one per CPU this process may use:
the affinity mask and the cgroup CPU quota, see cpus.py; under load the single unpinned CPU
replica may run one fewer when that serves more, see threadtune.py; pinned replicas run one per
CPU of their set) and `torch_interop_threads` (auto: 1), set once before the first model loads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import __version__, compat, gpu_metrics
from .batcher import Batcher, BatchInfo
from .config import Config, ConfigError, access_of
from .cpus import usable_cpus
from .errors import ApiError
from .logs import BatchSummary
from .metrics import Metrics
from .model import LoadedModel, ModelError
from .placement import Place, replica_places
from .predict import SERVING, PredictCall
from .replicas import Replica, Slot, build_slot
from .shadow import Shadow
from .threadtune import ThreadTuner
from .warmup import SizingReport
from .worker import Worker

log = logging.getLogger(__name__)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


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
    def __init__(self, config: Config, module: Any = None, shadow_module: Any = None) -> None:
        self.config = config
        self._module = module  # an nn.Module built by the caller (tests, embedding), not a file
        self._shadow_module = shadow_module  # the same for the shadow candidate
        self._shadow: Shadow | None = None
        self.metrics = Metrics()
        # called (in the thread that made it) after each change of state or model: edges.py
        self.on_change: list[Callable[[], None]] = []
        # called before this process renders the metrics (edges.py: count what edges sent)
        self.before_render: list[Callable[[], None]] = []
        self.drain_waiters: list[Callable[[float], bool]] = []
        self._state = "loading"
        self._slot: Slot | None = None
        self.places: list[Place] = []
        self.max_body_bytes = int(config.max_body_mb * 2**20)
        # predictions admitted to a batcher and not yet answered (the drain waits for them)
        self._admitted = 0
        self._admitted_cond = threading.Condition()
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self._reload_lock = threading.Lock()
        self._reloads = {"ok": 0, "failed": 0}
        self._last_reload: dict[str, Any] | None = None
        self._summary = BatchSummary(log, config.log_summary_s)
        self.stage_timing = config.stage_timing
        self.threads = (0, 0)
        self._nvml: Any = None
        self._lost: dict[str, str] = {}  # replicas lost while serving: label -> why

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        changed = value != self._state
        self._state = value
        if changed:
            self._changed()

    def _changed(self) -> None:
        for fn in self.on_change:
            fn()

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
        if self.state == "degraded":
            out["not_ready"] = "degraded: " + "; ".join(
                f"replica {label} failed ({why})" for label, why in self._failed().items()
            )
        if detail:
            out["model"] = self._describe()
        return out

    def metrics_text(self) -> bytes:
        for fn in self.before_render:
            fn()
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

    def _failed(self) -> dict[str, str]:
        """Replicas that do not serve now: failed at the slot's build, or lost since."""
        slot = self._slot
        failed = dict(slot.failed) if slot else {}
        if slot:
            failed.update(
                (w.label, w.lost) for w in slot.batcher.workers if w.lost and w.label not in failed
            )
        return failed

    def _liveness(self) -> tuple[bool, str]:
        """Alive unless start-up failed, every replica's worker stopped, or one batch ran past
        stuck_timeout_s."""
        if self.state == "failed":
            return False, "start-up failed"
        b = self.batcher
        if b is None:
            return True, ""
        if not b.is_alive() and self.state in SERVING:
            return False, "the batch workers have stopped"
        since = b.busy_since
        if since is not None and time.monotonic() - since > self.config.stuck_timeout_s:
            return False, f"one batch has run for more than {self.config.stuck_timeout_s:.0f} s"
        return True, ""

    def _describe(self) -> dict[str, Any] | None:
        slot = self._slot
        if slot is None:
            return None
        info = slot.loaded.metadata.as_dict()
        serving = slot.serving
        info.update(
            model_version=slot.version,
            format=slot.loaded.format,
            device=str(slot.loaded.device)
            if len(slot.replicas) == 1
            else serving[0].place.device.type,
            precision=self.config.precision,
            access=access_of(self.config),
            optimization=slot.loaded.optimization,
            state=self.state,
            max_batch_size=slot.batcher.cap,
            batch_cap_method=slot.sizing.method,
            capacity_items_per_s=_rounded(slot.batcher.capacity),
            warmed_batch_sizes=list(slot.batcher.buckets),
            max_delay_ms=self.config.max_delay_ms,
            max_queue=slot.batcher.max_queue,
            torch_threads=slot.batcher.threads or self.threads[0],
            torch_threads_auto=(
                None if slot.batcher.thread_tuner is None else slot.batcher.thread_tuner.last
            ),
            torch_interop_threads=self.threads[1],
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            driver_version=self._nvml.driver_version() if self._nvml is not None else None,
            runtime_version=__version__,
            reloads={**self._reloads, "last": self._last_reload},
            shadow=None if self._shadow is None else self._shadow.summary(),
            replicas=[self._describe_replica(r, slot) for r in slot.replicas],
            outputs=serving[0].outputs if serving else [],
        )
        return info

    def _describe_replica(self, r: Replica, slot: Slot) -> dict[str, Any]:
        worker = next((w for w in slot.batcher.workers if w.label == r.label), None)
        why = self._failed().get(r.label)
        out: dict[str, Any] = {
            **r.place.as_dict(),
            "state": "failed" if why else "serving",
            "error": why,
            "torch_threads": (worker.threads if worker else 0)
            or r.place.threads
            or self.threads[0],
            "sized_batch_cap": r.sizing.cap if r.sizing else None,
            "load_s": round(r.load_s, 3),
            "warm_s": round(r.warm_s, 3),
        }
        if worker is not None:
            out["pipeline"] = worker.describe()
            out["busy_s"] = round(worker.busy_s, 3)
            out["recent_batches"] = [
                {
                    "at": round(at, 3),
                    "size": size,
                    "bucket": bucket,
                    "reason": reason,
                    "model_ms": round(model_s * 1000, 3),
                    "failed": failed,
                }
                for at, size, bucket, reason, model_s, failed in list(worker.recent)
            ]
        if r.place.device.type == "cuda":
            try:
                out["memory"] = gpu_metrics.device_memory(r.place.device)
            except Exception as exc:  # a lost GPU: say so, keep the card
                out["memory"] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    # --- building a slot ---------------------------------------------------------------------

    def _build_slot(self, held_bytes: dict[str, int] | None = None) -> Slot:
        """Load, size, warm and self-test the model on every replica, each in the thread that
        then serves it (replicas.py); returns once each serves or has failed."""
        cfg = self.config
        return build_slot(
            cfg,
            self.places,
            self._module,
            lambda workers, buckets: Batcher(
                workers,
                buckets,
                cfg.max_delay_ms / 1000,
                cfg.max_queue,
                wait_for_arrivals=cfg.batch_wait == "arrivals",
            ),
            self._thread_tuner,
            held_bytes,
            self._warming,
        )

    def _warming(self) -> None:
        if self.state == "loading":
            self.state = "warming"

    def _thread_tuner(self, replica: Replica) -> ThreadTuner | None:
        """torch_threads auto on the one unpinned CPU replica with 2+ CPUs: one per CPU or one
        fewer, as measured under the load (threadtune.py); set counts, pinned replicas and GPU
        models run as configured."""
        place = replica.place
        if self.config.torch_threads is not None or place.device.type != "cpu" or place.cpus:
            return None
        return ThreadTuner(self.threads[0]) if self.threads[0] >= 2 else None

    def _summarise(self, version: str, info: BatchInfo) -> None:
        self._summary.add(info.size, info.bucket, info.reason, info.model_s, version)

    def _start_shadow(self, slot: Slot) -> None:
        """(Re)build the shadow candidate beside `slot` when one is configured (shadow.py): at
        start-up once ready and after every reload, so a new candidate file is picked up too."""
        old = self._shadow
        if old is not None:
            old.close()
        path = self.config.shadow_model
        if self._shadow_module is None and (path is None or not Path(path).exists()):
            # no shadow test now: the file appears when one begins (a rollout copies it there)
            self._shadow = None
            if path is not None:
                log.info("no shadow candidate at %s: shadow testing is off until one is", path)
            return
        shadow = Shadow(self.config, self.metrics)
        shadow.start(slot.loaded, slot.batcher.buckets, self._shadow_module)
        self._shadow = shadow

    def _activate(self, slot: Slot) -> None:
        slot.batcher.attach_metrics(self.metrics)
        slot.batcher.on_batch.append(functools.partial(self._summarise, slot.version))
        slot.batcher.on_lost.append(self._replica_lost)
        m = self.metrics
        m.model_load.set(slot.load_s)
        m.warmup.set(slot.warm_s)
        m.set_model(
            slot.version,
            slot.loaded.metadata.name,
            slot.loaded.format,
            str(slot.loaded.device)
            if len(slot.replicas) == 1
            else ",".join(r.label for r in slot.replicas),
            self.config.precision,
        )
        for r in slot.replicas:
            m.device(r.label).ready.set(0 if r.label in slot.failed else 1)
        self._slot = slot  # the swap: one reference assignment, atomic for every reader
        self._changed()

    def _replica_lost(self, worker: Worker) -> None:
        """A serving replica's device failed (worker.py): the node is degraded."""
        self.metrics.device(worker.label).ready.set(0)
        self._set_ready()
        self._changed()

    def _set_ready(self) -> None:
        """ready when every replica serves, degraded when some do not (states in the doc)."""
        if self.state in ("draining", "stopped", "failed") or self.stop_requested.is_set():
            return
        failed = self._failed()
        self.state = "degraded" if failed else "ready"
        self.metrics.ready.set(0 if failed else 1)
        self.metrics.degraded.set(1 if failed else 0)
        if failed:
            log.error(
                "degraded: %s",
                "; ".join(f"replica {k} does not serve ({v})" for k, v in failed.items()),
                extra={"fields": {"failed_replicas": failed}},
            )

    # --- lifecycle -----------------------------------------------------------------------------

    def load_and_warm(self) -> None:
        """Set the thread counts, place the replicas, load the model and size the batch cap on
        each, warm every bucket, turn ready (or degraded)."""
        self.threads = configure_threads(self.config)  # intra-op: torch applies it in every thread
        log.info("torch threads: %d intra-op, %d inter-op", *self.threads)
        self.places = replica_places(self.config)
        log.info(
            "model replicas: %s",
            ", ".join(p.label for p in self.places),
            extra={"fields": {"replicas": [p.as_dict() for p in self.places]}},
        )
        if self._nvml is None:
            self._nvml = gpu_metrics.register(
                self.metrics.registry, [p.device for p in self.places], self.config.memory_fraction
            )
        slot = self._build_slot()
        if self.stop_requested.is_set():
            slot.batcher.close(0)
            return
        self._activate(slot)
        self._set_ready()
        if self.state == "ready":
            log.info("ready", extra={"fields": {"model_version": slot.version}})
            self._start_shadow(slot)

    def start(self) -> None:
        """Load and warm, blocking until ready (tests, embedding; `app` runs it in a thread)."""
        try:
            self.load_and_warm()
        except BaseException:
            self.state = "failed"
            raise

    def _reload(self, reason: str) -> dict[str, Any]:
        old = self._slot
        if self.state not in SERVING or old is None:
            raise ApiError(503, "not_ready", f"the runtime is {self.state}; nothing to reload yet")
        log.info(
            "reload (%s): loading %s beside version %s",
            reason,
            self.config.model or "the module",
            old.version,
        )
        started = time.perf_counter()
        held = {
            r.label: int(torch.cuda.memory_allocated(r.place.device))
            for r in old.serving
            if r.place.device.type == "cuda"
        }
        try:
            new = self._build_slot(held_bytes=held)
            if new.failed:  # a reload must bring every replica: a smaller node is not a new version
                new.batcher.close(0)
                label, why = next(iter(new.failed.items()))
                raise ModelError(f"replica {label}: {why}")
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
        if self.state not in SERVING:  # a drain began while the new model warmed: keep the old one
            new.batcher.close(0)
            raise ApiError(
                503, "not_ready", "the runtime began draining during the reload", close=True
            )
        self._activate(new)
        self._set_ready()  # every replica serves again (a reload heals a degraded node)
        self._start_shadow(new)
        previous, old_cap = old.version, old.batcher.cap
        old.batcher.close(timeout=self.config.stuck_timeout_s)  # finishes what it holds
        del old
        compat.cuda_empty_cache()
        caps = (old_cap, new.batcher.cap)
        result = self._record_reload(
            "ok", started, previous, new.version, None, {"before": caps[0], "after": caps[1]}
        )
        if caps[0] != caps[1]:  # the new model sustains another batch: a rollout's capacity guard
            log.warning(
                "reload: the batch cap changed from %d to %d (%s), %s instances/s at the cap",
                caps[0],
                caps[1],
                new.sizing.method,
                _rounded(new.batcher.capacity),
                extra={"fields": {"batch_cap": result["batch_cap"]}},
            )
        log.info(
            "reload done: version %s serving (was %s) after %.2f s",
            new.version,
            result["previous_version"],
            result["seconds"],
            extra={"fields": result},
        )
        return result

    def _record_reload(
        self,
        result: str,
        started: float,
        previous: str,
        version: str | None,
        error: str | None,
        batch_cap: dict[str, int] | None = None,
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
            "batch_cap": batch_cap,  # before and after an ok reload
        }
        return dict(self._last_reload)

    def request_stop(self, reason: str) -> None:
        """Begin draining now (thread- and signal-safe); `app` finishes the job."""
        if self.state in ("draining", "stopped"):
            return
        self.stop_reason = reason
        self.state = "draining"
        self.metrics.ready.set(0)
        if self._shadow is not None:
            self._shadow.close()  # the drain's CPU is the admitted requests'
        log.warning("draining: %s", reason)
        self.stop_requested.set()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every admitted prediction has been answered; False on timeout. The
        `drain_waiters` (edges.py: every edge process has answered what it admitted) go first."""
        deadline = time.monotonic() + timeout_s
        edges_done = all(
            [wait(max(0.0, deadline - time.monotonic())) for wait in self.drain_waiters]
        )
        if not edges_done and self._admitted == 0:
            log.error("drain timeout: an edge process still holds admitted requests")
            return False
        with self._admitted_cond:
            while self._admitted > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("drain timeout: %d request(s) still in flight", self._admitted)
                    return False
                self._admitted_cond.wait(left)
        return edges_done

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
        if self._shadow is not None:
            self._shadow.close()
        if self._slot is not None:
            self._slot.batcher.close(timeout=worker_timeout_s)
        if self.state != "failed":
            self.state = "stopped"

    # --- used by PredictCall ---------------------------------------------------------------------

    @property
    def current_slot(self) -> Slot | None:
        """The model serving now (a reload swaps it atomically)."""
        return self._slot

    @property
    def shadow(self) -> Shadow | None:
        return self._shadow

    def retry_after(self) -> int:
        return self._retry_after()

    def admit(self, delta: int) -> None:
        with self._admitted_cond:
            self._admitted += delta
            if self._admitted == 0:
                self._admitted_cond.notify_all()


__all__ = ["ApiError", "BatchInfo", "PredictCall", "Runtime", "Slot", "configure_threads"]
