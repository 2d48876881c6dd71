"""The model owner's side of the edge processes: the listening socket, the processes, the hand-off.

`EdgePool` binds the listening socket itself (so `port: 0` still gives the bound port), starts
`edge_workers` edge processes (edge.py) with `subprocess.Popen([sys.executable, "-m",
"torchfleet_runtime.edge", ...], pass_fds=...)`, fresh interpreters that never inherit this
process's torch, OpenMP or CUDA state, and gives each one socketpair and one ring (handoff.py).
It has the listener interface app.Service drives (`start`, `begin_closing`, `wait_drained`,
`stop`, `port`, `scheme`), like httpd.HttpServer in a single-process runtime.

Per edge, a reader thread turns each SUBMIT into the owner's half of a request
(predict.PredictCall: the same admission, queue_full, too_large, drain and reload-swap rules as a
single-process runtime): a tensor view of the slot (codec.to_tensor; cast when the body travelled
as a wider dtype; NaN/Inf refused here for binary bodies) submitted to the batcher. The batch
worker only queues the finished call; a writer thread per edge packs the outputs into the slot
(or inline) and sends every answer that is ready in one write. RECORDS (each finished request as
the edge saw it) are counted and logged through the same call (`finish`), so the owner's
`/metrics` is the node's only exposition and counts each request once. STATE goes to every edge
whenever the runtime's state or model changes (and liveness is re-read periodically).

An edge that exits is started again (`torchfleet_edge_restarts_total`, an error log line); its
in-flight requests are dropped (counted 499), nothing else fails, and its ring is released once
the batches holding its slots are done. Drain: DRAIN to every edge; each answers new predictions
503 with Connection: close, finishes what it admitted and says DRAINED. `stop` closes the
sockets: the edges close their connections and exit (as they do when this process dies).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import orjson

from . import auth, codec, handoff
from .auth import Tokens
from .config import Config
from .cpus import usable_cpus
from .errors import ApiError, error_body, internal_error
from .handoff import Answer, Failure, FrameReader, FrameWriter, Ring, Submit
from .predict import PredictCall
from .tls import server_context
from .v2 import V1_ROUTE, V2_ROUTE
from .wire import Decoded

if TYPE_CHECKING:
    from .service import Runtime

log = logging.getLogger(__name__)

RING_SLOTS = 64  # predictions in flight per edge
RING_SLOT_BYTES = 256 << 10  # a decoded body (or answer) up to this size lives in its slot
STATE_POLL_S = 0.5  # liveness (a stuck batch) is re-read this often
TOKEN_POLL_S = 0.05  # the token file is looked at this often or every auth.RECHECK_S if longer
START_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = 1.0  # an edge that exits sooner than this after its start waits this long


def edge_workers(config: Config, on_gpu: bool, cpus: int | None = None) -> int:
    """`edge_workers`, auto resolved: on a GPU node every usable CPU but one for the owner (its
    threads feed the GPU and do little arithmetic), at least 1; on a CPU-only node one edge per four
    usable CPUs, since there the model's torch threads need the cores the edges would take, and
    below four none (0: the edge in the owner's process): with no core to spare, a process hop
    only costs (benchmarks/README.md, "Edge processes")."""
    if config.edge_workers is not None:
        return config.edge_workers
    n = usable_cpus() if cpus is None else cpus
    return max(1, n - 1) if on_gpu else n // 4


# one queued answer: the request, the owner's call, a failure decided before the batch
_Queued = Optional[Tuple[Submit, PredictCall, Optional[ApiError]]]


class EdgeLink:
    """One edge process and its hand-off."""

    def __init__(
        self, index: int, proc: subprocess.Popen[bytes], sock: socket.socket, ring: Ring
    ) -> None:
        self.index = index
        self.proc = proc
        self.sock = sock
        self.writer = FrameWriter(sock)
        self.ring = ring
        self.pending: dict[int, PredictCall] = {}  # seq -> call, until the edge's record
        self.answers: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self.drained = threading.Event()
        self.acked = 0
        self.started = time.monotonic()
        self.connections = 0
        self.inflight = 0


class EdgePool:
    def __init__(
        self,
        runtime: Runtime,
        config: Config,
        workers: int,
        reload: Callable[[str], dict[str, Any]],
        tokens: Tokens,
        slots: int | None = None,
        slot_bytes: int | None = None,
    ) -> None:
        self.rt = runtime
        self.config = config
        self.workers = workers
        self._reload = reload
        self.tokens = tokens
        self.slots = slots or RING_SLOTS
        self.slot_bytes = slot_bytes or RING_SLOT_BYTES
        self.ssl = server_context(config)  # a bad certificate fails here, before any process
        self.links: list[EdgeLink | None] = [None] * workers
        self.closing = False
        self.stopping = False
        self.restarts = 0
        self._lock = threading.Lock()
        self._ack = threading.Condition()
        self._state_n = 0
        self._last_state = b""
        self._listen: socket.socket | None = None
        self._poller: threading.Thread | None = None
        self._stop_poll = threading.Event()
        self.port = 0
        runtime.on_change.append(self.push_state)
        runtime.before_render.append(self.settle)
        runtime.drain_waiters.append(self.wait_drained)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl is not None else "http"

    # --- the listener interface --------------------------------------------------------------

    def start(self) -> None:
        """Bind (OSError here when the port is taken) and start the edges; they start while the
        model loads (connections wait in the socket's backlog until an edge accepts them)."""
        host, port = self.config.host, self.config.port
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._listen = socket.create_server((host, port), family=family, backlog=1024)
        self.port = int(self._listen.getsockname()[1])
        self.rt.metrics.edge_workers.set(self.workers)
        for i in range(self.workers):
            self._spawn(i)
        self._poller = threading.Thread(
            target=self._poll, name="torchfleet-edge-state", daemon=True
        )
        self._poller.start()

    def begin_closing(self) -> None:
        """Drain: every edge answers new predictions 503 with Connection: close from now on."""
        self.closing = True
        for link in self._alive():
            if not link.writer.send(handoff.frame(handoff.DRAIN)):
                link.drained.set()

    def wait_drained(self, timeout_s: float) -> bool:
        """True once every edge has answered what it admitted (False after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        return all(
            link.drained.wait(max(0.0, deadline - time.monotonic())) for link in self._alive()
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Close the sockets: the edges close their connections and exit; wait for them."""
        self.stopping = True
        self._stop_poll.set()
        links = self._alive()
        for link in links:
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_RDWR)
            link.answers.put(None)
        deadline = time.monotonic() + timeout
        for link in links:
            try:
                link.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                link.proc.kill()
                link.proc.wait(5)
        if self._listen is not None:
            self._listen.close()
            self._listen = None

    def tokens_changed(self) -> None:
        """The token file may have changed (SIGHUP, a reload): every edge reads it again."""
        for link in self._alive():
            link.writer.send(handoff.frame(handoff.TOKENS))

    def pids(self) -> list[int]:
        return [link.proc.pid for link in self._alive()]

    def _alive(self) -> list[EdgeLink]:
        with self._lock:
            return [link for link in self.links if link is not None]

    # --- processes -----------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        assert self._listen is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ring = Ring(self.slots, self.slot_bytes)
        fds = (theirs.fileno(), self._listen.fileno(), ring.fd)
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchfleet_runtime.edge", "--fds", ",".join(map(str, fds))],
            pass_fds=fds,
            close_fds=True,
        )
        theirs.close()
        ring.close_fd()  # the map stays; the edge has its own descriptor
        link = EdgeLink(index, proc, ours, ring)
        cfg = dict(vars(self.config))  # max_connections holds per edge: the kernel picks the edge
        link.writer.send(
            handoff.json_frame(
                handoff.INIT,
                {
                    "config": cfg,
                    "index": index,
                    "slots": self.slots,
                    "slot_bytes": self.slot_bytes,
                    "token_recheck_s": auth.RECHECK_S,
                },
            )
        )
        link.writer.send(self._state_frame())
        if self.closing:
            link.writer.send(handoff.frame(handoff.DRAIN))
        with self._lock:
            self.links[index] = link
        threading.Thread(
            target=self._read, args=(link,), name=f"torchfleet-edge-{index}", daemon=True
        ).start()
        threading.Thread(
            target=self._write, args=(link,), name=f"torchfleet-edge-{index}-answers", daemon=True
        ).start()
        log.info("edge process %d started (pid %d)", index, proc.pid)

    def _lost(self, link: EdgeLink) -> None:
        code = link.proc.poll()
        if code is None:
            try:
                code = link.proc.wait(5)
            except subprocess.TimeoutExpired:
                link.proc.kill()
                code = link.proc.wait(5)
        link.answers.put(None)
        link.drained.set()
        for call in list(link.pending.values()):
            call.finish(499)
        link.pending.clear()
        if self.stopping:
            return
        self.restarts += 1
        self.rt.metrics.edge_restarts.inc()
        log.error(
            "edge process %d (pid %d) exited with code %s; its in-flight predictions are dropped, "
            "starting another",
            link.index,
            link.proc.pid,
            code,
        )
        with self._lock:
            self.links[link.index] = None
        if time.monotonic() - link.started < RESTART_BACKOFF_S:  # it died young: do not spin
            time.sleep(RESTART_BACKOFF_S)
        if not self.stopping:
            self._spawn(link.index)

    # --- state ---------------------------------------------------------------------------------

    def _state_frame(self) -> bytes:
        rt = self.rt
        st = rt.status()
        slot = rt.current_slot
        meta = slot.loaded.metadata if slot is not None else None
        doc = {
            "state": st["state"],
            "ready": st["ready"],
            "alive": st["alive"],
            "reason": st["reason"],
            "retry_after": st["retry_after"],
            "not_ready": st.get("not_ready", ""),
            "version": slot.version if slot is not None else None,
            "name": meta.name if meta is not None else None,
            "input_shape": list(meta.input_shape) if meta is not None else None,
            "dtype": codec.DTYPE_NAMES[meta.torch_dtype] if meta is not None else None,
        }
        self._last_state = orjson.dumps(doc)
        return handoff.frame(handoff.STATE, self._last_state)

    def push_state(self) -> None:
        """Send the state to every edge (the runtime calls it on each change)."""
        if self._listen is None:
            return
        data = self._state_frame()
        for link in self._alive():
            link.writer.send(data)

    def sync_state(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Push the state and wait until every edge has read it (start-up: ready means every
        edge answers /readyz from the current state)."""
        with self._ack:
            self._state_n += 1
            n = self._state_n
        data = self._state_frame() + handoff.frame(handoff.ACK_REQUEST, str(n).encode())
        for link in self._alive():
            link.writer.send(data)
        deadline = time.monotonic() + timeout_s
        with self._ack:
            while any(link.acked < n for link in self._alive()):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("an edge process did not take the state within %.0f s", timeout_s)
                    return
                self._ack.wait(left)

    def settle(self, timeout_s: float = 5.0) -> None:
        """Wait until every record the edges sent so far is counted (a read of the metrics in
        this process, tests; /metrics through an edge is answered in its own order instead)."""
        if threading.current_thread().name.startswith("torchfleet-edge"):
            return  # a reader thread cannot wait for the readers
        self.sync_state(timeout_s)

    def _poll(self) -> None:
        """Liveness, and the token file: each edge reads it when a request comes, so one that
        saw no request since a change is told here (all edges converge on the same file)."""
        last = time.monotonic()
        while not self._stop_poll.wait(min(STATE_POLL_S, max(auth.RECHECK_S, TOKEN_POLL_S))):
            if self.tokens.changed():
                self.tokens.reload()
                self.tokens_changed()
            if time.monotonic() - last < STATE_POLL_S:
                continue
            last = time.monotonic()
            before = self._last_state
            frame = self._state_frame()
            if self._last_state != before:
                for link in self._alive():
                    link.writer.send(frame)

    # --- the hand-off -----------------------------------------------------------------------------

    def _read(self, link: EdgeLink) -> None:
        for batch in FrameReader(link.sock).batches():
            for kind, p in batch:
                if kind == handoff.SUBMIT:
                    self._submit(link, handoff.unpack_submit(p))
                elif kind == handoff.RECORDS:
                    self._records(link, handoff.unpack_records(p))
                elif kind == handoff.CALL:
                    self._call(link, orjson.loads(p))
                elif kind == handoff.DRAINED:
                    link.drained.set()
                elif kind == handoff.ACK:
                    with self._ack:
                        link.acked = int(p)
                        self._ack.notify_all()
        self._lost(link)

    def _submit(self, link: EdgeLink, s: Submit) -> None:
        rt = self.rt
        call = PredictCall(rt, s.request_id, count_inflight=False)
        call.route = V2_ROUTE if s.v2 else V1_ROUTE  # a 499 after the edge's loss counts here
        link.pending[s.seq] = call
        try:
            if s.before_drain:
                call.admitted_elsewhere()
            else:
                call.check_ready()
            slot = call.slot
            assert slot is not None
            data = link.ring.slot(s.slot, s.nbytes) if not s.inline else s.inline
            t = codec.to_tensor(
                Decoded(data, s.shape, s.dtype, s.batched, s.binary),
                slot.loaded.metadata.torch_dtype,
                not rt.config.allow_non_finite_inputs,
            )
            call.submit_tensor(t, s.batched, owned=False)
        except ApiError as exc:
            link.answers.put((s, call, exc))
            return
        except Exception as exc:  # a bug: the client still gets an answer
            log.error("handing a prediction to the batcher failed", exc_info=exc)
            link.answers.put((s, call, internal_error(exc)))
            return
        call.add_done_callback(lambda: link.answers.put((s, call, None)))

    def _write(self, link: EdgeLink) -> None:
        """Answers, every one that is ready in one write (the batch worker only queues them)."""
        while True:
            item = link.answers.get()
            if item is None:
                return
            frames = [self._answer(link, *item)]
            while True:
                try:
                    more = link.answers.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    link.writer.send(b"".join(frames))
                    return
                frames.append(self._answer(link, *more))
            link.writer.send(b"".join(frames))

    def _answer(self, link: EdgeLink, s: Submit, call: PredictCall, exc: ApiError | None) -> bytes:
        if exc is None:
            try:
                outputs = call.outputs()
                structure, parts, non_finite = codec.output_parts(outputs, not s.raw_answer)
            except ApiError as e:
                exc = e
            except Exception as e:  # a bug in packing: the answer must still come
                log.error("answering a prediction failed", exc_info=e)
                exc = internal_error(e)
        if exc is not None:
            failure = Failure(exc.status, exc.type, exc.message, exc.retry_after, exc.close)
            return handoff.pack_answer(
                Answer(s.seq, handoff.NO_SLOT, failure, 0, [], False, 0.0, 0.0, call.version, b"")
            )
        total = sum(len(p.data) for p in parts)
        if s.slot != handoff.NO_SLOT and total <= link.ring.slot_bytes:
            view = link.ring.slot(s.slot, total)
            off = 0
            for part in parts:
                n = len(part.data)
                view[off : off + n] = part.data
                off += n
            where, inline = s.slot, b""
        else:
            where, inline = handoff.NO_SLOT, b"".join(bytes(p.data) for p in parts)
        t = call.timings
        return handoff.pack_answer(
            Answer(
                s.seq,
                where,
                None,
                structure,
                [(p.dtype, p.shape, len(p.data)) for p in parts],
                non_finite,
                t.get("queue", 0.0),
                t.get("model", 0.0),
                call.version,
                inline,
            )
        )

    def _records(self, link: EdgeLink, recs: handoff.Records) -> None:
        rt = self.rt
        for r in recs.records:
            call = link.pending.pop(r.seq, None) if r.seq else None
            if call is None:  # refused by the edge before the owner saw it
                call = PredictCall(rt, r.request_id, count_inflight=False)
            call.route = r.route
            call.timings["decode"] = r.decode_s
            call.timings["encode"] = r.encode_s
            err = ApiError(r.status, r.error_type, r.error_message) if r.error_type else None
            call.finish(r.status, err, r.total_s)
            if r.write_s:
                call.wrote(r.write_s)
        link.connections = recs.connections
        link.inflight = recs.inflight
        m = rt.metrics
        links = self._alive()
        m.connections.set(sum(x.connections for x in links))
        m.inflight.set(sum(x.inflight for x in links))
        if recs.rss_bytes:
            m.edge_memory.labels(edge=str(link.index)).set(recs.rss_bytes)

    def _call(self, link: EdgeLink, doc: dict[str, Any]) -> None:
        call_id, op = int(doc["id"]), str(doc["op"])
        if op == "reload":  # seconds: not in this reader's thread
            threading.Thread(
                target=self._reload_call,
                args=(link, call_id),
                name="torchfleet-reload",
                daemon=True,
            ).start()
            return
        try:
            status, retry, body = self._answer_call(op)
        except Exception as exc:  # a bug: the edge answers it 500 and keeps serving
            log.error("answering %s failed", op, exc_info=exc)
            bug = internal_error(exc)
            status, retry, body = 500, 0, error_body(bug.type, bug.message)
        link.writer.send(handoff.pack_result(call_id, status, retry, body))

    def _answer_call(self, op: str) -> tuple[int, int, bytes]:
        if op == "metrics":
            return 200, 0, self.rt.metrics.render()
        st = self.rt.status(detail=True)
        if st["model"] is None:
            return (
                503,
                int(st["retry_after"]),
                error_body("not_ready", f"the runtime is {st['state']}"),
            )
        card = dict(st["model"])
        card["edge_workers"] = self.workers
        card["edge_restarts"] = self.restarts
        return 200, 0, orjson.dumps(card)

    def _reload_call(self, link: EdgeLink, call_id: int) -> None:
        self.tokens.reload()
        self.tokens_changed()
        try:
            result = self._reload("POST /admin/reload")
            data = handoff.pack_result(call_id, 200, 0, orjson.dumps(result))
        except ApiError as exc:
            body = error_body(exc.type, exc.message)
            data = handoff.pack_result(call_id, exc.status, exc.retry_after or 0, body)
        except Exception as exc:
            log.error("reload failed", exc_info=exc)
            bug = internal_error(exc, close=False)
            data = handoff.pack_result(call_id, 500, 0, error_body(bug.type, bug.message))
        link.writer.send(data)
