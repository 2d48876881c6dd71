"""An edge process: the HTTP edge in front of the model owner, without torch.

`torchfleet-runtime serve` (the owner, app.py and edges.py) binds the listening socket and starts
`edge_workers` of these with `python -m torchfleet_runtime.edge --fds CONTROL,LISTEN,RING`: fresh
interpreters (a process with torch, OpenMP or CUDA initialised is never forked). Each runs the
same HTTP edge as a single-process runtime (httpd.py: limits, timeouts, TLS, request ids, the
fuzz hardening; server.py: the routes and auth, with its own auth.Tokens reading the token file),
decodes bodies into raw bytes (wire.py) and hands them to the owner (handoff.py), then encodes
the answer from the bytes the owner wrote back. It imports no torch: every core it runs on
decodes and encodes while the owner's threads feed the model.

Why one shared listening socket and not SO_REUSEPORT: with SO_REUSEPORT the kernel hashes each
connection's 4-tuple to one listener, so a few long-lived keep-alive clients can all land on one
edge while the others idle; with one inherited socket every edge accepts from the same queue, and
a new connection goes to whichever edge is free to accept it.

What crosses to the owner (handoff.py's frames): SUBMIT per prediction and its ANSWER; the
owner's STATE (readiness, liveness, the model's input shape and dtype, which decoding checks)
whenever it changes, so /livez and /readyz answer here; /v1/model, /metrics and POST
/admin/reload are CALLs the owner answers (it is the node's only metrics exposition: this
process sends each finished request's RECORD, status, route and stage times, and its connection
count). DRAIN: new predictions get 503 with Connection: close, admitted ones finish, then DRAINED.
TOKENS: read the token file again. When the owner's socket ends (it stopped or died) this process closes
its connections (idle ones after a short grace) and exits.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import orjson

from . import auth, handoff, logs, wire
from .auth import Tokens
from .config import Config
from .errors import ApiError
from .handoff import Answer, FrameReader, FrameWriter, Record, Records, Ring, Submit
from .httpd import HttpServer
from .server import build_http
from .v2 import V2Infer, route_label

log = logging.getLogger("torchfleet_runtime.edge")

SERVING = ("ready", "degraded")
CALL_TIMEOUT_S = 30.0


class OwnerState(NamedTuple):
    """The owner's STATE frame: what /livez and /readyz answer and what decoding checks."""

    state: str
    ready: bool
    alive: bool
    reason: str
    retry_after: int
    not_ready: str
    version: str | None
    input_shape: tuple[int, ...] | None
    dtype: str | None
    name: str | None  # the model's (the /v2 routes check requests against it)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class EdgeCall:
    """The edge's half of one prediction: the same interface server.Routes drives in a
    single-process runtime (predict.PredictCall), over the hand-off."""

    def __init__(self, edge: Edge, request_id: str) -> None:
        self.edge = edge
        self.request_id = request_id
        self.arrived = time.perf_counter()
        self.version = edge.state.version
        self.model_name = edge.state.name
        self.protocol: V2Infer | None = None  # a /v2 infer request (server.py sets it)
        self.seq = 0
        self.slot = handoff.NO_SLOT
        self.admitted = False
        self.before_drain = False
        self.batched = False
        self.decode_s = 0.0
        self.encode_s = 0.0
        self.answer_frame: Answer | None = None
        self._callbacks: list[Callable[[], object]] = []
        self.error: ApiError | None = None
        self._finished = False
        self.status = 0

    def check_ready(self) -> None:
        st = self.edge.state
        if st.state not in SERVING or st.version is None or self.edge.draining:
            state = "draining" if self.edge.draining else st.state
            raise ApiError(
                503,
                "not_ready",
                f"the runtime is {state}",
                5 if self.edge.draining else st.retry_after,
                close=state in ("draining", "stopped"),
            )

    def expect(self) -> None:
        if not self.admitted:
            self.admitted = True
            self.before_drain = not self.edge.draining
            self.edge.admitted += 1

    def submit(
        self, body: bytes | bytearray, content_type: str, headers: Mapping[str, str]
    ) -> None:
        edge = self.edge
        if not (self.admitted and self.before_drain):
            self.check_ready()
        st = edge.state
        assert st.input_shape is not None and st.dtype is not None
        t0 = time.perf_counter()
        decode = wire.decode if self.protocol is None else self.protocol.decode
        d = decode(body, content_type, headers, st.input_shape, st.dtype)
        self.decode_s = time.perf_counter() - t0
        self.batched = d.batched
        slot = edge.ring.take()
        if slot == handoff.NO_SLOT:
            raise ApiError(
                503,
                "queue_full",
                f"this edge process holds {edge.ring.slots} predictions in flight, its limit "
                "(the hand-off ring); retry shortly",
                1,
            )
        self.slot = slot
        n = len(d.data)
        inline = b""
        if n <= edge.ring.slot_bytes:
            edge.ring.slot(slot, n)[:] = d.data
        else:
            inline = bytes(d.data)
        self.seq = next(edge.seqs)
        edge.calls[self.seq] = self
        ok = edge.writer.send(
            handoff.pack_submit(
                Submit(
                    self.seq,
                    slot,
                    n,
                    d.batched,
                    # /v2 encodes each output in its own dtype
                    self.protocol is not None or wire.wants_raw(headers.get("accept", "")),
                    self.before_drain,
                    d.binary,
                    self.protocol is not None,
                    d.dtype,
                    d.shape,
                    self.request_id,
                    inline,
                )
            )
        )
        if not ok:
            edge.calls.pop(self.seq, None)
            self._release_slot()
            raise ApiError(503, "not_ready", "the model owner is gone", 5, close=True)

    def add_done_callback(self, fn: Callable[[], object]) -> None:
        if self.answer_frame is not None:
            fn()
        else:
            self._callbacks.append(fn)

    def answered(self, a: Answer) -> None:
        """The owner's ANSWER arrived (the control thread)."""
        self.answer_frame = a
        if a.version:
            self.version = a.version
        for fn in self._callbacks:
            fn()
        self._callbacks.clear()

    def _release_slot(self) -> None:
        if self.slot != handoff.NO_SLOT:
            self.edge.ring.give(self.slot)
            self.slot = handoff.NO_SLOT

    def answer(self, accept: str) -> tuple[bytes, str, dict[str, str]]:
        a = self.answer_frame
        assert a is not None
        try:
            if a.failure is not None:
                f = a.failure
                raise ApiError(f.status, f.type, f.message, f.retry_after, f.close)
            nbytes = sum(p[2] for p in a.parts)
            data = (
                self.edge.ring.slot(self.slot, nbytes)
                if a.slot != handoff.NO_SLOT
                else memoryview(a.inline)
            )
            parts = handoff.answer_parts(a, data)
            t0 = time.perf_counter()
            if self.protocol is not None:
                body, ctype, headers = self.protocol.encode(
                    a.structure,
                    parts,
                    self.batched,
                    a.non_finite,
                    self.edge.non_finite_as_null,
                    self.version,
                )
            elif wire.wants_raw(accept):
                if not isinstance(a.structure, int):
                    raise wire.NOT_ACCEPTABLE
                body, headers = wire.encode_raw(parts[a.structure], self.batched)
                ctype = "application/octet-stream"
            else:
                body = wire.encode_json(
                    a.structure, parts, self.batched, a.non_finite, self.edge.non_finite_as_null
                )
                ctype, headers = "application/json", {}
            self.encode_s = time.perf_counter() - t0
        finally:
            self._release_slot()  # the answer has been read: the slot is free again
        if self.edge.stage_timing:
            headers["Server-Timing"] = (
                f"decode;dur={self.decode_s * 1000:.3f}, queue;dur={a.queue_s * 1000:.3f}, "
                f"model;dur={a.model_s * 1000:.3f}, encode;dur={self.encode_s * 1000:.3f}"
            )
        return body, ctype, headers

    def wrote(self, write_s: float) -> None:
        """A 200's bytes went to the socket: the owner counts it now, with its write time."""
        if self.status == 200:
            self.edge.record(self, write_s)

    def finish(self, status: int, error: ApiError | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        self.status = status
        self.error = error
        edge = self.edge
        if self.answer_frame is None and self.seq:
            # the client left before the answer: the slot is freed when it comes
            self._callbacks.append(lambda: edge.loop_call(self._release_slot))
        edge.inflight -= 1
        edge.stats_changed()
        if status != 200:  # a 200 is recorded once written (wrote), with its write time
            edge.record(self, 0.0)
        if self.admitted:
            self.admitted = False
            edge.admitted -= 1
            edge.maybe_drained()


class Edge:
    """The process: the HTTP server in a thread, the owner's frames read in the main thread."""

    def __init__(
        self, control: socket.socket, listen: socket.socket, init: dict[str, Any], ring_fd: int
    ) -> None:
        cfg: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in init["config"].items()
        }
        self.config = Config(**cfg)
        self.index = int(init["index"])
        self.ring = Ring(int(init["slots"]), int(init["slot_bytes"]), ring_fd)
        self.control = control
        self.writer = FrameWriter(control)
        auth.RECHECK_S = float(init["token_recheck_s"])  # the owner's, as it was at the start
        self.tokens = Tokens(self.config.api_token, self.config.api_token_file)
        self.non_finite_as_null = self.config.non_finite_outputs == "null"
        self.stage_timing = self.config.stage_timing
        self.state = OwnerState("loading", False, True, "", 1, "", None, None, None, None)
        self.draining = False
        self.admitted = 0
        self.drained_sent = False
        self.seqs = itertools.count(1)
        self.calls: dict[int, EdgeCall] = {}
        self.connections = 0
        self.inflight = 0
        self._stats_due = False
        self._rss_at = 0.0
        self._results: dict[int, tuple[int, int, bytes]] = {}
        self._result_cond = threading.Condition()
        self._call_ids = itertools.count(1)
        self.http: HttpServer = build_http(self, self.config, self.tokens, self._on_count, listen)

    # --- server.RuntimeApi --------------------------------------------------------------------

    def predict(self, request_id: str) -> EdgeCall:
        self.inflight += 1
        self.stats_changed()
        return EdgeCall(self, request_id)

    def status(self, detail: bool = False) -> dict[str, Any]:
        st = self.state
        state = "draining" if self.draining else st.state
        out: dict[str, Any] = {
            "state": state,
            "ready": st.ready and not self.draining,
            "alive": st.alive,
            "reason": st.reason,
            "retry_after": 5 if self.draining else st.retry_after,
        }
        if st.not_ready and not self.draining:
            out["not_ready"] = st.not_ready
        if detail:
            status, _, body = self._call("model")
            if status == 500:  # the owner failed to build the card: a bug, answered as one
                err = orjson.loads(body)["error"]
                raise ApiError(500, err["type"], err["message"], close=True)
            out["model"] = orjson.loads(body) if status == 200 else None
        return out

    def reload(self, reason: str) -> dict[str, Any]:
        status, retry_after, body = self._call("reload")
        doc = orjson.loads(body)
        if status != 200:
            err = doc["error"]
            raise ApiError(status, err["type"], err["message"], retry_after or None)
        return dict(doc)

    def metrics_text(self) -> bytes:
        return self._call("metrics")[2]

    def _call(self, op: str) -> tuple[int, int, bytes]:
        """Ask the owner and wait for its RESULT (the main thread reads it)."""
        call_id = next(self._call_ids)
        if not self.writer.send(handoff.json_frame(handoff.CALL, {"id": call_id, "op": op})):
            raise ApiError(503, "not_ready", "the model owner is gone", 5, close=True)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        with self._result_cond:
            while call_id not in self._results:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiError(503, "not_ready", f"the model owner did not answer {op}", 5)
                self._result_cond.wait(left)
            return self._results.pop(call_id)

    # --- records and drain (the event loop's thread) --------------------------------------------

    def loop_call(self, fn: Callable[[], None]) -> None:
        self.http.loop.call_soon_threadsafe(fn)

    def _on_count(self, n: int) -> None:
        self.connections = n
        self.stats_changed()

    def record(self, call: EdgeCall, write_s: float) -> None:
        """Send the owner one finished request as soon as its answer is written (before the
        next request on the connection is read: /metrics on it counts this one)."""
        err = call.error
        rec = Record(
            call.seq,
            call.request_id,
            call.status,
            err.type if err is not None else "",
            err.message if err is not None else "",
            time.perf_counter() - call.arrived,
            call.decode_s,
            call.encode_s,
            write_s,
            route_label(call.protocol),
        )
        now = time.monotonic()
        rss = 0
        if now - self._rss_at > 1.0:  # resident memory: at most once a second
            self._rss_at, rss = now, _rss_bytes()
        self._stats_due = False
        self.writer.send(handoff.pack_records(Records([rec], self.connections, self.inflight, rss)))

    def stats_changed(self) -> None:
        """Connections or in-flight predictions changed: tell the owner once this loop turn."""
        if not self._stats_due:
            self._stats_due = True
            self.http.loop.call_soon(self._send_stats)

    def _ack(self, token: bytes) -> None:
        self._send_stats()
        self.writer.send(handoff.frame(handoff.ACK, token))

    def _send_stats(self) -> None:
        if self._stats_due:
            self._stats_due = False
            self.writer.send(handoff.pack_records(Records([], self.connections, self.inflight, 0)))

    def maybe_drained(self) -> None:
        if self.draining and self.admitted == 0 and not self.drained_sent:
            self.drained_sent = True
            self.writer.send(handoff.frame(handoff.DRAINED))

    def _drain(self) -> None:
        self.draining = True
        self.http.closing = True
        self.maybe_drained()

    # --- the owner's frames (main thread) -------------------------------------------------------

    def run(self, batches: Iterator[list[tuple[int, bytes]]]) -> int:
        """Serve once the owner's first STATE is in (a replacement edge never answers from a
        state it has not been told); read the owner's frames until its socket ends."""
        serving = told = False
        for batch in batches:
            answers: list[Answer] = []
            for kind, p in batch:
                if kind == handoff.ANSWER:
                    answers.append(handoff.unpack_answer(p))
                elif kind == handoff.STATE:
                    d = orjson.loads(p)
                    shape = d.get("input_shape")
                    d["input_shape"] = tuple(shape) if shape is not None else None
                    self.state = OwnerState(**d)
                    told = True
                    if self.state.state in ("draining", "stopped") and not self.draining:
                        self.loop_call(self._drain)  # the owner began to drain
                elif kind == handoff.RESULT:
                    call_id, status, retry_after, body = handoff.unpack_result(p)
                    with self._result_cond:
                        self._results[call_id] = (status, retry_after, body)
                        self._result_cond.notify_all()
                elif kind == handoff.DRAIN:
                    self.loop_call(self._drain)
                elif kind == handoff.TOKENS:
                    self.tokens.reload()
                elif kind == handoff.ACK_REQUEST:
                    # through the event loop: what it has scheduled to send goes first
                    self.loop_call(lambda p=p: self._ack(p))  # type: ignore[misc]
            if answers:
                self.loop_call(lambda answers=answers: self._deliver(answers))  # type: ignore[misc]
            if not serving and told:
                serving = True
                self.http.start()
        # the owner stopped or died: this node no longer serves
        log.info("edge %d: the model owner is gone; closing", self.index)
        self.state = self.state._replace(state="stopped", ready=False)
        self.draining = True
        if serving:
            self.http.stop()
        return 0

    def _deliver(self, answers: list[Answer]) -> None:
        for a in answers:
            call = self.calls.pop(a.seq, None)
            if call is not None:
                call.answered(a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchfleet_runtime.edge")
    p.add_argument("--fds", required=True, help="CONTROL,LISTEN,RING file descriptors")
    args = p.parse_args(argv)
    control_fd, listen_fd, ring_fd = (int(x) for x in args.fds.split(","))
    control = socket.socket(fileno=control_fd)
    listen = socket.socket(fileno=listen_fd)
    batches = FrameReader(control).batches()
    first = next(batches, None)
    if not first or first[0][0] != handoff.INIT:
        return 1
    init = orjson.loads(first[0][1])
    logs.setup(init["config"]["log_level"], init["config"]["log_format"])
    if os.environ.get("TORCHFLEET_EDGE_SELF_CHECK"):  # tests: prove this process has no torch
        print(f"edge {init['index']}: torch imported: {'torch' in sys.modules}", file=sys.stderr)
    rest = first[1:]
    return Edge(control, listen, init, ring_fd).run(
        itertools.chain([rest] if rest else [], batches)
    )


if __name__ == "__main__":
    sys.exit(main())
