"""Building a slot: the model loaded, sized, warmed and self-tested on every replica's device,
with the one batcher that feeds them all. What a start and a reload build, and swap in.

Contract. `build_slot(config, places, module, ...)` starts one thread per `Place`
(placement.py); each pins itself there, then:
  1. loads the model onto its device, optimises it (optimize.py) and sizes its batch cap;
  2. once every replica has sized (or failed), warms the buckets of the smallest cap (one cap and
     one set of buckets for the node: the shared queue forms batches any replica may run), then
     captures a CUDA graph per warmed bucket where `cuda_graphs` allows (graphs.py);
  3. once every replica has warmed, the batcher is made with a worker per surviving replica;
     each replica runs the self-test (one JSON request through the real path) on its own worker
     and then serves in the same thread (see Batcher.serve_here).
`build_slot` returns when every replica has passed or failed step 3. A replica that fails is
reported in `Slot.failed` (label -> why) and never serves; when none is left the first failure
is raised. The caller decides what a smaller slot means (service.py: degraded).
Replicas build in parallel: GPUs load and warm at once; pinned CPU replicas size on their own
CPUs.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from . import codec
from .batcher import Batcher, thread_name
from .config import Config
from .errors import ApiError
from .graphs import Graphs, capture
from .model import LoadedModel, ModelError, load
from .optimize import optimize
from .placement import Place, pin_current_thread
from .tensors import buckets_up_to, non_finite
from .threadtune import ThreadTuner
from .warmup import SizingReport, load_sample, size_cap, warm_up
from .worker import Worker

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One replica as built: its place, model, sizing and what building it took."""

    place: Place
    loaded: LoadedModel | None = None
    sizing: SizingReport | None = None
    sample: torch.Tensor | None = None
    seconds: dict[int, float] = field(default_factory=dict)  # bucket -> fastest run
    warmed: list[int] = field(default_factory=list)
    graphs: Graphs | None = None  # CUDA graphs captured at warm-up (graphs.py), or why not
    load_s: float = 0.0
    warm_s: float = 0.0
    error: BaseException | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)  # the card's (codec.output_card)
    stage: int = 0  # the last step (1-3) it finished

    @property
    def label(self) -> str:
        return self.place.label


@dataclass
class Slot:
    """The replicas of one model version with their batcher: what a reload builds and swaps in."""

    replicas: list[Replica]
    batcher: Batcher
    failed: dict[str, str] = field(default_factory=dict)  # label -> why it does not serve
    meta_key: tuple[Any, ...] = field(default=())

    @property
    def serving(self) -> list[Replica]:
        return [r for r in self.replicas if r.error is None]

    @property
    def loaded(self) -> LoadedModel:
        loaded = self.serving[0].loaded
        assert loaded is not None
        return loaded

    @property
    def sizing(self) -> SizingReport:
        """The sizing of the replica whose cap is the node's (the smallest)."""
        reports = [r.sizing for r in self.serving if r.sizing is not None]
        return min(reports, key=lambda s: s.cap)

    @property
    def version(self) -> str:
        return self.loaded.version

    @property
    def load_s(self) -> float:
        return max(r.load_s for r in self.serving)

    @property
    def warm_s(self) -> float:
        return max(r.warm_s for r in self.serving)


class _Build:
    """The replicas' threads meet here between steps (module doc)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.cond = threading.Condition()
        self.batcher: Batcher | None = None
        self.cancelled = False

    def finished(self, r: Replica, stage: int, error: BaseException | None = None) -> None:
        with self.cond:
            r.stage = stage
            if error is not None and r.error is None:
                r.error = error
            self.cond.notify_all()

    def wait_all(self, stage: int) -> list[Replica]:
        """Block until every replica reached `stage` or failed; the survivors ([] if cancelled)."""
        with self.cond:
            self.cond.wait_for(
                lambda: (
                    self.cancelled
                    or all(r.error is not None or r.stage >= stage for r in self.replicas)
                )
            )
            if self.cancelled:
                return []
            return [r for r in self.replicas if r.error is None]


def build_slot(
    config: Config,
    places: Sequence[Place],
    module: Any,
    make_batcher: Callable[[list[Worker], list[int]], Batcher],
    tuner: Callable[[Replica], ThreadTuner | None],
    held_bytes: dict[str, int] | None = None,
    on_warming: Callable[[], None] = lambda: None,
) -> Slot:
    """Build and start serving every replica (module doc); raises the first failure when none
    is left. `make_batcher(workers, buckets)` makes the batcher, `tuner(replica)` a replica's
    thread tuner (or None); `held_bytes` (label -> bytes) is CUDA memory an old model holds on
    that device during a reload (not counted against the new cap's memory share)."""
    replicas = [Replica(p) for p in places]
    modules = [
        module if (module is None or i == 0 or p.device.type == "cpu") else copy.deepcopy(module)
        for i, p in enumerate(places)
    ]
    build = _Build(replicas)
    workers: dict[int, Worker] = {}

    def run(i: int) -> None:
        r = replicas[i]
        try:
            pin_current_thread(r.place)
            _load_and_size(config, r, modules[i], (held_bytes or {}).get(r.label, 0), on_warming)
        except BaseException as exc:
            build.finished(r, 1, exc)
            return
        build.finished(r, 1)
        try:
            survivors = build.wait_all(1)
            if not survivors:
                return
            cap = min(s.sizing.cap for s in survivors if s.sizing is not None)
            _warm(config, r, cap)
        except BaseException as exc:
            build.finished(r, 2, exc)
            return
        build.finished(r, 2)
        survivors = build.wait_all(2)
        with build.cond:
            if build.batcher is None and survivors:
                buckets = min((s.warmed for s in survivors), key=len)
                for s in survivors:
                    assert s.loaded is not None
                    workers[replicas.index(s)] = Worker(
                        s.loaded.predictor,
                        s.label,
                        {b: s.seconds[b] for b in buckets if b in s.seconds},
                        tuner(s),
                        s.place.threads or 0,
                        s.graphs,
                    )
                build.batcher = make_batcher([workers[k] for k in sorted(workers)], buckets)
        batcher = build.batcher
        if batcher is None or i not in workers:
            return
        index = batcher.workers.index(workers[i])
        try:
            _self_test(r, batcher, index)
        except BaseException as exc:
            workers[i].lost = f"self-test: {exc}"
            build.finished(r, 3, exc)
            return
        build.finished(r, 3)
        batcher.serve_here(index)

    threads = [
        threading.Thread(target=run, args=(i,), name=thread_name(p.label, len(places)), daemon=True)
        for i, p in enumerate(places)
    ]
    for t in threads:
        t.start()
    survivors = build.wait_all(3)
    failed = {r.label: _why(r.error) for r in replicas if r.error is not None}
    if not survivors:
        with build.cond:
            build.cancelled = True
            build.cond.notify_all()
        if build.batcher is not None:
            build.batcher.close(0)
        first = next(r.error for r in replicas if r.error is not None)
        assert first is not None
        raise first
    assert build.batcher is not None
    for label, why in failed.items():
        log.error("replica %s does not serve: %s", label, why)
    meta = survivors[0].loaded.metadata if survivors[0].loaded else None
    key = (meta.input_shape, meta.dtype) if meta else ()
    return Slot(replicas, build.batcher, failed, key)


def _why(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, (ModelError, ApiError)) or type(exc).__name__ == "ConfigError":
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _load_and_size(
    config: Config, r: Replica, module: Any, held_bytes: int, on_warming: Callable[[], None]
) -> None:
    t0 = time.perf_counter()
    loaded = load(config, module, r.place.device)
    r.load_s = time.perf_counter() - t0
    log.info(
        "loaded %s model %r version %s on %s in %.2f s",
        loaded.format,
        loaded.metadata.name,
        loaded.version,
        r.label,
        r.load_s,
    )
    on_warming()
    t1 = time.perf_counter()
    r.sample = load_sample(config.sample_input, loaded.metadata)
    r.loaded = optimize(loaded, r.sample, config.optimize)
    r.sizing = size_cap(
        r.loaded.predictor,
        r.sample,
        config.max_batch_size,
        config.memory_fraction,
        config.latency_budget_ms / 1000,
        held_bytes,
    )
    # the fastest run of each bucket, sizing's (CPU) or warm-up's: the batcher's costs
    r.seconds = dict(r.sizing.measurements) if r.sizing.method == "latency" else {}
    r.warm_s = time.perf_counter() - t1


def _warm(config: Config, r: Replica, cap: int) -> None:
    assert r.loaded is not None and r.sample is not None and r.sizing is not None
    t0 = time.perf_counter()
    # sizing's runs count towards warm-up: they ran the same shapes
    r.warmed = warm_up(
        r.loaded.predictor,
        r.sample,
        buckets_up_to(cap),
        config.warmup_iterations,
        r.sizing.runs,
        r.seconds,
    )
    # every bucket is warm (readiness needs no graph): capture where it is right and faster
    r.graphs = capture(r.loaded.predictor, r.sample, r.warmed, config.cuda_graphs)
    r.warm_s += time.perf_counter() - t0
    log.info("warmed batch sizes %s on %s in %.2f s", r.warmed, r.label, r.warm_s)


def _self_test(r: Replica, batcher: Batcher, index: int) -> None:
    """One request through the real path (JSON decode, pad/run/split, encode) before the
    replica serves: warms the code a first request runs besides the model, and fails start-up
    (or the reload), not the first client, when the model's outputs cannot be answered."""
    assert r.loaded is not None and r.sample is not None
    t0 = time.perf_counter()
    meta = r.loaded.metadata
    batcher.check_now(r.sample, index)  # staging kept only where not slower (staging.py)
    body = codec.dumps({"inputs": r.sample[0].tolist()})
    tensor, batched = codec.decode(body, "application/json", {}, meta.input_shape, meta.torch_dtype)
    outputs = batcher.run_now(tensor, index)
    non_finite(
        outputs
    )  # the check a JSON answer runs (random inputs may well give NaN: not a failure)
    try:
        codec.encode_json(outputs, batched, non_finite_as_null=True)
        r.outputs = codec.output_card(outputs)
    except ApiError as exc:
        raise ModelError(f"the self-test answer failed: {exc.message}") from None
    r.warm_s += time.perf_counter() - t0
