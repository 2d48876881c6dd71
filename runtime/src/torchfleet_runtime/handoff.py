"""The hand-off between an edge process and the model owner: frames on a socket, bodies in a ring.

Contract (edge.py is one side, edges.py the other; neither imports torch here).
- Per edge one `socket.socketpair` (AF_UNIX, SOCK_STREAM) carries frames: a 5-byte header
  (payload length, kind) packed with struct, then the payload. Request-path frames (SUBMIT,
  ANSWER) are struct-packed with a small orjson part for the answer's structure; RESULT is a
  struct head and the answer's body; the control frames (INIT, STATE, CALL, RECORDS) are orjson.
  Nothing is pickled.
- Per edge one `Ring`: `slots` fixed-size slots in one anonymous memory file
  (`os.memfd_create`, its descriptor inherited by the edge with pass_fds, mapped by both). It
  is freed with the last map and is not bounded by a container's small /dev/shm. A slot is an
  in-flight permit: the edge takes one per prediction and writes the decoded body there when it
  fits (a larger body travels inline in its SUBMIT frame, one copy more); no free slot is a 503
  `queue_full` with Retry-After, so an edge's memory is bounded by the ring.
- Slot reuse rule: the owner reads the input from the slot (a tensor view) until the batch that
  holds it has run, then writes the answer's bytes into the same slot when they fit (else
  inline) and sends ANSWER. The edge frees the slot only once it has read that ANSWER: by then
  the batch has run and every copy out of the slot has completed, so a slot is never written
  while the owner may still read it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
import threading
from typing import Any, Iterator, NamedTuple

import orjson

from .wire import OutputPart, Structure

# frame kinds
INIT, STATE, SUBMIT, ANSWER, CALL, RESULT, RECORDS, DRAIN, DRAINED, TOKENS = range(1, 11)
ACK_REQUEST, ACK = 11, 12  # "say when you have read the frames before this one" and its reply
_HEAD = struct.Struct("<IB")
_SUBMIT = struct.Struct("<QiQBH")  # seq, slot (-1: inline), nbytes, flags, meta length
_ANSWER = struct.Struct("<QiQI")  # seq, slot (-1: inline), data bytes, head length
_RESULT = struct.Struct("<IHH")  # call id, status, retry-after (0: none)
F_BATCHED, F_RAW_ANSWER, F_BEFORE_DRAIN, F_BINARY, F_V2 = 1, 2, 4, 8, 16
NO_SLOT = -1


class Submit(NamedTuple):
    """An edge's decoded request (the body's bytes in `slot`, or `inline` when none fits)."""

    seq: int
    slot: int
    nbytes: int
    batched: bool
    raw_answer: bool  # the client asked for application/octet-stream
    before_drain: bool  # its headers were accepted before the edge heard of a drain
    binary: bool  # a raw or .npy body (checked for NaN/Inf by the owner)
    v2: bool  # a /v2 infer request (its metrics' route; a dropped one is counted under it)
    dtype: str
    shape: tuple[int, ...]
    request_id: str
    inline: bytes


class Failure(NamedTuple):
    """What the client is told when a prediction fails (errors.ApiError's fields)."""

    status: int
    type: str
    message: str
    retry_after: int | None
    close: bool


class Answer(NamedTuple):
    """The owner's answer to one Submit: outputs (their bytes in the slot or inline) or a failure."""

    seq: int
    slot: int
    failure: Failure | None
    structure: Structure
    parts: list[tuple[str, tuple[int, ...], int]]  # dtype, shape, bytes of each output tensor
    non_finite: bool
    queue_s: float
    model_s: float
    version: str | None
    inline: bytes


class Record(NamedTuple):
    """One finished request as its edge saw it (the owner counts and logs it)."""

    seq: int  # the Submit's seq, 0 when it never reached the owner
    request_id: str
    status: int
    error_type: str
    error_message: str
    total_s: float
    decode_s: float
    encode_s: float
    write_s: float
    route: str  # the metrics' route label (v2.ROUTE_LABELS)


class Records(NamedTuple):
    """Finished requests (maybe none) and the edge's counts now."""

    records: list[Record]
    connections: int
    inflight: int  # predictions from their headers to their answer
    rss_bytes: int  # 0: not measured this time


def frame(kind: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload), kind) + payload


def json_frame(kind: int, doc: Any) -> bytes:
    return frame(kind, orjson.dumps(doc))


def pack_submit(s: Submit) -> bytes:
    flags = (
        (F_BATCHED if s.batched else 0)
        | (F_RAW_ANSWER if s.raw_answer else 0)
        | (F_BEFORE_DRAIN if s.before_drain else 0)
        | (F_BINARY if s.binary else 0)
        | (F_V2 if s.v2 else 0)
    )
    meta = f"{s.dtype};{','.join(map(str, s.shape))};{s.request_id}".encode()
    return frame(SUBMIT, _SUBMIT.pack(s.seq, s.slot, s.nbytes, flags, len(meta)) + meta + s.inline)


def unpack_submit(p: bytes) -> Submit:
    seq, slot, nbytes, flags, mlen = _SUBMIT.unpack_from(p)
    start = _SUBMIT.size
    dtype, shape, rid = p[start : start + mlen].decode().split(";", 2)
    return Submit(
        seq,
        slot,
        nbytes,
        bool(flags & F_BATCHED),
        bool(flags & F_RAW_ANSWER),
        bool(flags & F_BEFORE_DRAIN),
        bool(flags & F_BINARY),
        bool(flags & F_V2),
        dtype,
        tuple(int(d) for d in shape.split(",")),
        rid,
        p[start + mlen :],
    )


def pack_answer(a: Answer) -> bytes:
    head = orjson.dumps(
        {
            "f": None if a.failure is None else list(a.failure),
            "s": a.structure,
            "p": a.parts,
            "n": a.non_finite,
            "q": a.queue_s,
            "m": a.model_s,
            "v": a.version,
        }
    )
    nbytes = sum(p[2] for p in a.parts)
    return frame(ANSWER, _ANSWER.pack(a.seq, a.slot, nbytes, len(head)) + head + a.inline)


def unpack_answer(p: bytes) -> Answer:
    seq, slot, _, hlen = _ANSWER.unpack_from(p)
    start = _ANSWER.size
    h = orjson.loads(p[start : start + hlen])
    f = h["f"]
    return Answer(
        seq,
        slot,
        None if f is None else Failure(*f),
        h["s"],
        [(d, tuple(s), n) for d, s, n in h["p"]],
        h["n"],
        h["q"],
        h["m"],
        h["v"],
        p[start + hlen :],
    )


def answer_parts(a: Answer, data: memoryview) -> list[OutputPart]:
    """The answer's output tensors, slicing `data` (the slot's bytes or the inline ones)."""
    out = []
    off = 0
    for dtype, shape, n in a.parts:
        out.append(OutputPart(data[off : off + n], dtype, shape))
        off += n
    return out


def pack_result(call_id: int, status: int, retry_after: int, body: bytes) -> bytes:
    return frame(RESULT, _RESULT.pack(call_id, status, retry_after) + body)


def unpack_result(p: bytes) -> tuple[int, int, int, bytes]:
    call_id, status, retry_after = _RESULT.unpack_from(p)
    return call_id, status, retry_after, p[_RESULT.size :]


def pack_records(r: Records) -> bytes:
    return json_frame(
        RECORDS,
        {"r": [list(x) for x in r.records], "c": r.connections, "i": r.inflight, "m": r.rss_bytes},
    )


def unpack_records(p: bytes) -> Records:
    d = orjson.loads(p)
    return Records([Record(*x) for x in d["r"]], d["c"], d["i"], d["m"])


class Ring:
    """`slots` slots of `slot_bytes` in one anonymous memory file, mapped in both processes."""

    def __init__(self, slots: int, slot_bytes: int, fd: int | None = None) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        size = max(1, slots * slot_bytes)
        if fd is None:
            fd = os.memfd_create("torchfleet-ring", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd = fd
        self.map = mmap.mmap(fd, size)
        self.view = memoryview(self.map)
        self._free = list(range(slots - 1, -1, -1))

    def take(self) -> int:
        """A free slot (edge side), NO_SLOT when every slot is in flight."""
        return self._free.pop() if self._free else NO_SLOT

    def give(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def in_use(self) -> int:
        return self.slots - len(self._free)

    def slot(self, i: int, nbytes: int) -> memoryview:
        off = i * self.slot_bytes
        return self.view[off : off + nbytes]

    def close_fd(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class FrameReader:
    """Whole frames from a blocking stream socket; iteration ends at EOF."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def batches(self) -> Iterator[list[tuple[int, bytes]]]:
        """Every complete frame a read brought, in order (one list per read)."""
        head = _HEAD.size
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                return
            if not chunk:
                return
            buf = self.buf
            buf += chunk
            out = []
            off = 0
            while len(buf) - off >= head:
                n, kind = _HEAD.unpack_from(buf, off)
                if len(buf) - off - head < n:
                    break
                out.append((kind, bytes(buf[off + head : off + head + n])))
                off += head + n
            del buf[:off]
            if out:
                yield out


class FrameWriter:
    """Frames onto a blocking stream socket from any thread (one lock, whole frames)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, data: bytes) -> bool:
        """False when the other side is gone."""
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False
