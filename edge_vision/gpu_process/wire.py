"""The control channel between a worker and the GPU process: small binary messages on a
Unix stream socket. Sans-I/O: what a message is and its bytes; the shells
(:mod:`.link` in the worker, :mod:`.process` in the GPU process) read and write them.

Each message is ``<u32 body length><u8 type><body>``, little-endian:

* worker → GPU process: ``HELLO`` (the worker's index and pid; its ring's file descriptor
  rides along as SCM_RIGHTS), ``SUBMIT`` (one frame: where it lies in the ring, its
  session, whether a newer frame of that session may take its place, the session's
  settings, and whether the worker post-processes it itself), ``CANCEL`` (the worker no
  longer wants that frame's answer);
* GPU process → worker: ``STATUS`` (its engine's state, JSON, at the start and on each
  change), ``RESULT`` (one frame's end: its detections, and each box's rotated rectangle
  when asked, or, for a frame the worker post-processes, the engine's outputs for it
  (:func:`encode_outputs`: DB's byte map, 225 KB at 640x352, or a YOLO head's boxes after
  the device NMS); or superseded, cancelled, or the error it earned; with how its stages
  went).

Pixels never cross: the frame's compressed bytes are in the ring, and what comes back is
the detections (24 bytes each) or the engine's outputs for the frame, which the worker's
own post-processing turns into them: one interpreter for a node's GPU cannot also run
every camera's post-processing (docs/benchmarks.md, "post on the workers").
"""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from .ring import Record

F32Array = npt.NDArray[np.float32]

FRAME: Final = struct.Struct("<IB")
HELLO: Final = ord("H")
SUBMIT: Final = ord("S")
CANCEL: Final = ord("C")
RESULT: Final = ord("R")
STATUS: Final = ord("T")
#: The longest body either side accepts (a result of many boxes with their rectangles).
MAX_BODY: Final = 16 * 1024 * 1024

_HELLO = struct.Struct("<IIQ")  # worker index, pid, ring bytes
# seq, record offset, length, stamp, session, confidence, input size (0: the server's),
# flags, number of classes (then that many u16)
_SUBMIT = struct.Struct("<QIIIQfHBH")
_CANCEL = struct.Struct("<Q")
# seq, outcome, batch size, batch number, timings (decode, shape, queued, batch wait,
# infer, post: seconds), detections, flags; then N x 6 float32 and, with quads, N x 8
_RESULT = struct.Struct("<QBHI6fIB")
_ERROR = struct.Struct("<HH")  # code length, message length; then both, UTF-8

LATEST: Final = 1  # a newer frame of the session may take this one's place
QUADS: Final = 2  # answer each box's rotated rectangle too (the worker reads text)
_CLASSES: Final = 4  # a class filter follows
RAW: Final = 8  # answer the engine's outputs for the frame: the worker post-processes it
_HAS_QUADS: Final = 1  # a result's flags: rectangles follow the detections
_HAS_OUTPUTS: Final = 2  # the engine's outputs follow (encode_outputs)

Outcome = Literal["ok", "superseded", "cancelled", "error"]
_OUTCOMES: tuple[Outcome, ...] = ("ok", "superseded", "cancelled", "error")


def message(kind: int, body: bytes) -> bytes:
    return FRAME.pack(len(body), kind) + body


async def read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next message; raises IncompleteReadError at the end of the stream and
    ValueError for a body over :data:`MAX_BODY`."""
    length, kind = FRAME.unpack(await reader.readexactly(FRAME.size))
    if length > MAX_BODY:
        raise ValueError(f"a control message of {length} bytes")
    return kind, await reader.readexactly(length)


@dataclass(frozen=True, slots=True)
class Hello:
    worker: int
    pid: int
    ring_bytes: int

    def encode(self) -> bytes:
        return message(HELLO, _HELLO.pack(self.worker, self.pid, self.ring_bytes))

    @classmethod
    def decode(cls, body: bytes) -> Hello:
        return cls(*_HELLO.unpack(body))


@dataclass(frozen=True, slots=True)
class Submit:
    seq: int  # the worker's number for this frame, unique while it is in flight
    record: Record
    session: int  # the worker's number for the session: superseding and fair turns
    latest: bool
    quads: bool
    confidence: float
    input_size: int | None
    classes: frozenset[int] | None
    raw: bool = False  # the worker post-processes it: answer the engine's outputs

    def encode(self) -> bytes:
        classes = sorted(self.classes) if self.classes is not None else []
        flags = (LATEST if self.latest else 0) | (QUADS if self.quads else 0)
        flags |= (_CLASSES if self.classes is not None else 0) | (RAW if self.raw else 0)
        r = self.record
        head = _SUBMIT.pack(
            self.seq,
            r.offset,
            r.length,
            r.stamp,
            self.session,
            self.confidence,
            self.input_size or 0,
            flags,
            len(classes),
        )
        return message(SUBMIT, head + struct.pack(f"<{len(classes)}H", *classes))

    @classmethod
    def decode(cls, body: bytes) -> Submit:
        seq, off, length, stamp, session, conf, size, flags, n = _SUBMIT.unpack_from(body)
        classes = struct.unpack_from(f"<{n}H", body, _SUBMIT.size)
        return cls(
            seq,
            Record(off, length, stamp),
            session,
            bool(flags & LATEST),
            bool(flags & QUADS),
            conf,
            size or None,
            frozenset(classes) if flags & _CLASSES else None,
            bool(flags & RAW),
        )


def cancel(seq: int) -> bytes:
    return message(CANCEL, _CANCEL.pack(seq))


def decode_cancel(body: bytes) -> int:
    return int(_CANCEL.unpack(body)[0])


@dataclass(frozen=True, slots=True)
class StageTimes:
    """How a frame's stages went in the GPU process, in seconds."""

    decode_s: float = 0.0
    shape_s: float = 0.0
    queued_s: float = 0.0  # waiting in the GPU process's queue before its decode
    batch_wait_s: float = 0.0
    infer_s: float = 0.0
    post_s: float = 0.0
    batch_size: int = 0
    batch: int = 0  # the engine batch's number: frames with the same one ran together


@dataclass(frozen=True, slots=True)
class Result:
    seq: int
    outcome: Outcome
    detections: F32Array
    quads: F32Array | None = None
    times: StageTimes = StageTimes()
    error_code: str = ""
    error_message: str = ""
    # The engine's outputs for the frame, for the worker's post, encode_outputs'd (the
    # GPU process encodes them in its post job; the worker decodes them in its own).
    outputs: bytes | None = None

    def encode(self) -> bytes:
        return b"".join(self.encode_parts())

    def encode_parts(self) -> list[bytes]:
        """The message in pieces, the engine's outputs (large) last and not copied into
        the rest: for a transport's ``writelines``."""
        t = self.times
        dets = np.ascontiguousarray(self.detections, dtype="<f4").reshape(-1, 6)
        quads = self.quads
        head = _RESULT.pack(
            self.seq,
            _OUTCOMES.index(self.outcome),
            t.batch_size,
            t.batch,
            t.decode_s,
            t.shape_s,
            t.queued_s,
            t.batch_wait_s,
            t.infer_s,
            t.post_s,
            len(dets),
            (_HAS_QUADS if quads is not None else 0)
            | (_HAS_OUTPUTS if self.outputs is not None else 0),
        )
        parts = [head, dets.tobytes()]
        if quads is not None:
            parts.append(np.ascontiguousarray(quads, dtype="<f4").reshape(-1, 8).tobytes())
        outputs = self.outputs or b""
        if self.outcome == "error":
            code, text = self.error_code.encode(), self.error_message.encode()[:4000]
            parts += [_ERROR.pack(len(code), len(text)), code, text]
        body = b"".join(parts)
        head = FRAME.pack(len(body) + len(outputs), RESULT) + body
        if outputs and self.outcome == "error":
            raise ValueError("an error result carries no outputs")
        return [head, outputs] if outputs else [head]

    @classmethod
    def decode(cls, body: bytes) -> Result:
        seq, outcome, size, batch, dec, shape, queued, wait, infer, post, n, flags = (
            _RESULT.unpack_from(body)
        )
        at = _RESULT.size
        dets = np.frombuffer(body, "<f4", n * 6, at).reshape(n, 6).astype(np.float32)
        at += n * 24
        quads = None
        if flags & _HAS_QUADS:
            quads = np.frombuffer(body, "<f4", n * 8, at).reshape(n, 4, 2).astype(np.float32)
            at += n * 32
        outputs = None
        if flags & _HAS_OUTPUTS:
            outputs = body[at:]  # the rest of the body (never with an error): decode_outputs
        code = text = ""
        if _OUTCOMES[outcome] == "error":
            lc, lt = _ERROR.unpack_from(body, at)
            at += _ERROR.size
            code = body[at : at + lc].decode()
            text = body[at + lc : at + lc + lt].decode(errors="replace")
        return cls(
            seq,
            _OUTCOMES[outcome],
            dets,
            quads,
            StageTimes(dec, shape, queued, wait, infer, post, size, batch),
            code,
            text,
            outputs,
        )


#: The kinds of dtype an engine's outputs come in: bool, signed and unsigned integers,
#: floats (numpy's ``dtype.kind``).
_KINDS = "biuf"
#: An output's header: its dtype's numpy string (``<f4``, ``|u1``: 3 bytes), dimensions;
#: then each dimension as u32, then the data.
_OUTPUT = struct.Struct("<3sB")

#: Outputs of at least this many bytes cross deflated (zlib level 1, in the GPU process's
#: post threads, which it lets run beside the event loop): DB's byte map of a 1280x720
#: frame, 225 KB, is mostly zeros and crosses in 2-33 KB, which the event loop of the GPU
#: process writes for a fraction of what the whole map costs it (docs/benchmarks.md,
#: "post on the workers").
DEFLATE_FROM = 16 * 1024


def encode_outputs(outputs: list[np.ndarray]) -> bytes:
    """One frame's rows of the engine's outputs: a byte saying whether the rest is
    deflated, then a count, then each output's dtype, shape and little-endian bytes. The
    rest of the message is these outputs. The arrays are read where they lie (deflated
    without a copy first: zlib lets go of the interpreter while it works)."""
    pieces: list[bytes | memoryview] = [struct.pack("<B", len(outputs))]
    total = 1
    for o in outputs:
        a = np.asarray(o)
        little = a.dtype.newbyteorder("<")
        if a.dtype.kind not in _KINDS or len(little.str) != 3 or a.ndim > 8:
            raise ValueError(f"an engine output of dtype {a.dtype} and {a.ndim} dimensions")
        a = np.require(a, dtype=little, requirements="C")
        pieces += [
            _OUTPUT.pack(little.str.encode(), a.ndim) + struct.pack(f"<{a.ndim}I", *a.shape),
            a.reshape(-1).data.cast("B") if a.size else b"",
        ]
        total += _OUTPUT.size + 4 * a.ndim + a.nbytes
    if total < DEFLATE_FROM:
        return b"".join([b"\x00", *pieces])
    deflate = zlib.compressobj(1)
    return b"".join([b"\x01", *(deflate.compress(p) for p in pieces), deflate.flush()])


def decode_outputs(body: bytes, at: int = 0) -> list[np.ndarray]:
    """:func:`encode_outputs`'s arrays (read-only) from ``body[at:]`` (all of the rest)."""
    if body[at] == 1:
        body, at = zlib.decompress(memoryview(body)[at + 1 :]), 0
    else:
        at += 1
    (count,) = struct.unpack_from("<B", body, at)
    at += 1
    outputs = []
    for _ in range(count):
        code, ndim = _OUTPUT.unpack_from(body, at)
        at += _OUTPUT.size
        shape = struct.unpack_from(f"<{ndim}I", body, at)
        at += 4 * ndim
        dtype = np.dtype(code.decode())
        if dtype.kind not in _KINDS:
            raise ValueError(f"an output of dtype {dtype}")
        n = int(np.prod(shape, dtype=np.int64))
        outputs.append(np.frombuffer(body, dtype, n, at).reshape(shape))
        at += n * dtype.itemsize
    return outputs


def status(state: dict[str, Any]) -> bytes:
    return message(STATUS, json.dumps(state).encode())


def decode_status(body: bytes) -> dict[str, Any]:
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("a status message that is not an object")
    return value
