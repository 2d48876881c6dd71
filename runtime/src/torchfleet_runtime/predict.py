"""One prediction from arrival to the last byte written: the runtime's half of a request.

`Runtime.predict(request_id)` returns a `PredictCall`: `check_ready` refuses at once when the
runtime does not serve, `expect` announces a body on its way (a forming batch may wait for it, and
from then on the drain does too), `submit` decodes the body and admits it to the batcher (an
`ApiError` for every refusal), a done callback fires in the worker's thread when the model has
run, `answer` encodes it (in the caller's thread, so encoding never holds up the model),
`wrote` and `finish` record what the client got. An edge process (edge.py, edges.py) decodes
the body itself: the owner's half of its request is the same call, through `submit_tensor` (the
decoded tensor) and `outputs` (the model's outputs, which the edge encodes). Metrics (each stage
labelled with the replica that ran the request), per-request logs and drain accounting live
here, not in the HTTP layer.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from . import codec, wire
from .batcher import OutOfMemory, QueueFull, ReplicaLost, Request, Stopped, TooLarge
from .errors import ApiError
from .tensors import Outputs
from .v2 import route_label
from .wire import wants_raw

if TYPE_CHECKING:
    from .replicas import Slot
    from .service import Runtime
    from .v2 import V2Infer

log = logging.getLogger(__name__)
reqlog = logging.getLogger("torchfleet_runtime.request")

SERVING = ("ready", "degraded")  # states that take predictions (degraded: on fewer replicas)


def server_timing(t: Mapping[str, float]) -> str:
    """The Server-Timing header of a 200 from its stage timings (seconds)."""
    return (
        f"decode;dur={t.get('decode', 0.0) * 1000:.3f}, queue;dur={t.get('queue', 0.0) * 1000:.3f}, "
        f"model;dur={t.get('model', 0.0) * 1000:.3f}, encode;dur={t.get('encode', 0.0) * 1000:.3f}"
    )


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
        "shadow_input",
        "protocol",
        "route",
        "admitted",
        "_expecting",
        "_finished",
        "_status",
        "_count",
    )

    def __init__(self, rt: Runtime, request_id: str, count_inflight: bool = True) -> None:
        self.rt = rt
        self.request_id = request_id
        self.arrived = time.perf_counter()
        self.slot: Slot | None = rt.current_slot
        self.request: Request | None = None
        self.batched = False
        self.timings: dict[str, float] = {}
        self.shadow_input: torch.Tensor | None = None  # kept only when sampled for the shadow
        self.protocol: V2Infer | None = None  # a /v2 infer request (server.py sets it)
        self.route: str | None = None  # the metrics' route when an edge decoded (else protocol's)
        self.admitted = False
        self._expecting = False
        self._finished = False
        self._status = 0
        # an edge process counts its own in-flight predictions (edges.py sums them)
        self._count = count_inflight
        if count_inflight:
            rt.metrics.inflight.inc()

    @property
    def version(self) -> str | None:
        return self.slot.version if self.slot else None

    @property
    def model_name(self) -> str | None:
        return self.slot.loaded.metadata.name if self.slot else None

    def check_ready(self) -> None:
        """Refuse at once (before the body is read) when not serving."""
        rt = self.rt
        if rt.state not in SERVING or self.slot is None:
            draining = rt.state in ("draining", "stopped")
            raise ApiError(
                503, "not_ready", f"the runtime is {rt.state}", rt.retry_after(), close=draining
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
            self.rt.admit(1)

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
            decode = wire.decode if self.protocol is None else self.protocol.decode
            d = decode(body, content_type, headers, meta.input_shape, meta.dtype)
            tensor = codec.to_tensor(d, meta.torch_dtype, not rt.config.allow_non_finite_inputs)
            batched = d.batched
            self.timings["decode"] = time.perf_counter() - t0
        except BaseException:
            self._unexpect()
            raise
        self.submit_tensor(tensor, batched)

    def admitted_elsewhere(self) -> None:
        """An edge process accepted this request's headers (before any drain): admit it here as
        `expect` would, so a drain that began since still serves it."""
        self._admit()

    def submit_tensor(self, tensor: torch.Tensor, batched: bool, owned: bool = True) -> None:
        """Admit a decoded tensor to the batcher; raises ApiError for every refusal. `owned`
        False: the tensor views memory that is reused after the answer (an edge's slot), so a
        sample kept for the shadow is copied."""
        rt = self.rt
        self.batched = batched
        try:
            if not self._accepted_before_drain:
                self.check_ready()
        except BaseException:
            self._unexpect()
            raise
        slot = self.slot
        assert slot is not None
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
                current = rt.current_slot
                if (
                    (rt.state in SERVING or self._accepted_before_drain)
                    and current is not None
                    and current is not slot
                    and current.meta_key == slot.meta_key
                ):
                    slot = self.slot = current  # a reload swapped models between decode and submit
                    expected = False
                    continue
                raise ApiError(503, "not_ready", "the runtime is draining", 5, close=True) from None
        self._admit()
        shadow = rt.shadow
        if shadow is not None and shadow.sampled():
            self.shadow_input = tensor if owned else tensor.clone()

    def add_done_callback(self, fn: Callable[[], object]) -> None:
        assert self.request is not None

        def done() -> None:
            fn()

        self.request.add_done_callback(done)

    def outputs(self) -> Outputs:
        """The model's outputs for this request (offered to the shadow when sampled); raises
        ApiError when the model failed."""
        assert self.request is not None and self.slot is not None
        try:
            outputs = self.request.result(0)
        except OutOfMemory as exc:
            raise ApiError(503, "out_of_memory", str(exc), 5) from None
        except ReplicaLost as exc:
            raise ApiError(503, "replica_failed", str(exc), 1) from None
        except ApiError:
            raise
        except Exception as exc:  # the model failed: the client did nothing wrong
            raise ApiError(500, "model_error", f"{type(exc).__name__}: {exc}") from None
        if self.shadow_input is not None:
            self._offer_to_shadow(outputs)
        self.timings["queue"] = self.request.queue_s
        self.timings["model"] = self.request.model_s
        return outputs

    def answer(self, accept: str) -> tuple[bytes, str, dict[str, str]]:
        """(body, content type, headers) of the 200; raises ApiError when the model failed."""
        outputs = self.outputs()
        t0 = time.perf_counter()
        as_null = self.rt.config.non_finite_outputs == "null"
        if self.protocol is not None:
            structure, parts, nf = codec.output_parts(outputs, for_json=False)
            body, ctype, headers = self.protocol.encode(
                structure, parts, self.batched, nf, as_null, self.version
            )
        elif wants_raw(accept):
            body, headers = codec.encode_raw(outputs, self.batched)
            ctype = "application/octet-stream"
        else:
            body = codec.encode_json(outputs, self.batched, as_null)
            ctype, headers = "application/json", {}
        t = self.timings
        t["encode"] = time.perf_counter() - t0
        if self.rt.stage_timing:
            headers["Server-Timing"] = server_timing(t)
        return body, ctype, headers

    def _offer_to_shadow(self, outputs: Any) -> None:
        """Hand the sampled input and its live outputs to the shadow (never waits); a fault in
        the shadow is logged, and this answer goes out as it is."""
        shadow, tensor, self.shadow_input = self.rt.shadow, self.shadow_input, None
        assert self.request is not None and self.slot is not None and tensor is not None
        if shadow is None:
            return
        b = self.slot.batcher
        try:
            shadow.offer(tensor, outputs, self.request.model_s, b.queued, b.cap)
        except Exception:
            log.exception("the shadow could not take a sampled request")

    def wrote(self, write_s: float) -> None:
        """The answer's bytes were handed to the socket in `write_s`."""
        if self.rt.stage_timing and self._status == 200 and self.request is not None:
            self.rt.metrics.device(self.request.device).stage["write"].observe(write_s)

    def finish(
        self, status: int, error: ApiError | None = None, total_s: float | None = None
    ) -> None:
        """The answer is about to be written (or the client is gone): count it, log it, release
        it. `total_s`: the request's time as its edge process measured it."""
        if self._finished:
            return
        self._finished = True
        self._status = status
        rt = self.rt
        self._unexpect()
        m = rt.metrics
        route = self.route if self.route is not None else route_label(self.protocol)
        m.answered(route, status).inc()
        total = time.perf_counter() - self.arrived if total_s is None else total_s
        if status == 200:
            m.latency(route).observe(total)
            m.last_request.set(time.time())
            if rt.stage_timing and self.request is not None:
                stage = m.device(self.request.device).stage
                t = self.timings
                stage["decode"].observe(t.get("decode", 0.0))
                stage["queue"].observe(t.get("queue", 0.0))
                stage["encode"].observe(t.get("encode", 0.0))
        if self._count:
            m.inflight.dec()
        if self.admitted:
            rt.admit(-1)
        if error is not None:  # every 5xx at error, every 4xx at info (logs.py)
            reqlog.log(
                logging.ERROR if status >= 500 else logging.INFO,
                "%s %s: %s",
                status,
                error.type,
                error.message,
                extra={
                    "request_id": self.request_id,
                    "fields": {"status": status, "type": error.type, "route": route},
                },
            )
        elif reqlog.isEnabledFor(logging.DEBUG):
            fields = {
                "status": status,
                "route": route,
                "ms": round(total * 1000, 3),
                "model_version": self.version,
                **{k + "_ms": round(v * 1000, 3) for k, v in self.timings.items()},
            }
            reqlog.debug(
                "predict %s", status, extra={"request_id": self.request_id, "fields": fields}
            )
