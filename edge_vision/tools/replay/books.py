"""The books of one replay: what became of each frame (:class:`Outcome`), frames put back
in frame order (:class:`InOrder`), and the counts and latencies of the summary
(:class:`ReplayStats`). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ...common.sources import SourceFrame
from ..bench.stats import summary

T = TypeVar("T")
Status = Literal["answered", "dropped", "error", "unanswered"]

#: Stages reported in the summary, in path order (docs/protocol.md ``timing`` plus ours).
STAGES = (
    "encode_ms",
    "decode_ms",
    "shape_ms",
    "queue_ms",
    "batch_wait_ms",
    "infer_ms",
    "post_ms",
    "read_ms",  # with --read (read.py)
    "server_ms",
    "latency_ms",
)


class InOrder(Generic[T]):
    """Releases items by sequence number, oldest first, never with a gap.

    Outcomes arrive out of order (a frame dropped by latest-wins is settled while the one
    before it is still in the engine); outputs must be written in frame order.
    """

    def __init__(self) -> None:
        self.next_seq = 0
        self._held: dict[int, T] = {}

    def add(self, seq: int, item: T) -> list[tuple[int, T]]:
        if seq < self.next_seq or seq in self._held:
            raise RuntimeError(f"frame {seq} settled twice")
        self._held[seq] = item
        ready: list[tuple[int, T]] = []
        while self.next_seq in self._held:
            ready.append((self.next_seq, self._held.pop(self.next_seq)))
            self.next_seq += 1
        return ready

    @property
    def held(self) -> int:
        return len(self._held)


@dataclass(slots=True)
class Outcome:
    """What became of one frame."""

    status: Status
    result: dict[str, Any] | None = None  # the protocol's ``result`` message
    error: dict[str, str] | None = None  # ``{"code", "message"}`` from an ``error`` message
    reason: str | None = None  # why a frame went unanswered
    latency_ms: float | None = None  # offered/sent → answer received


@dataclass(slots=True)
class Encoded:
    """A frame read and JPEG-encoded in the reader thread, ready to offer or send."""

    frame: SourceFrame
    jpeg: bytes
    encode_ms: float


@dataclass(slots=True)
class FrameRecord:
    seq: int
    encoded: Encoded
    outcome: Outcome


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 (bench's, numpy's linear interpolation) and max, rounded to 0.01;
    nothing for no values."""
    if not values:
        return {}
    stats = summary(values)
    return {key: round(stats[key], 2) for key in ("p50", "p95", "p99", "max")}


class ReplayStats:
    """Counters and per-stage latencies, in frame order; the summary's source. Pure."""

    def __init__(self) -> None:
        self.frames = 0
        self.counts: dict[Status, int] = {"answered": 0, "dropped": 0, "error": 0, "unanswered": 0}
        self.stages: dict[str, list[float]] = {s: [] for s in STAGES}
        self.batch_sizes: list[float] = []
        self.error_codes: dict[str, int] = {}

    def add(self, record: FrameRecord) -> None:
        oc = record.outcome
        self.frames += 1
        self.counts[oc.status] += 1
        if oc.status == "error" and oc.error is not None:
            code = oc.error.get("code", "?")
            self.error_codes[code] = self.error_codes.get(code, 0) + 1
        self.stages["encode_ms"].append(record.encoded.encode_ms)
        if oc.status != "answered" or oc.result is None:
            return
        timing = oc.result.get("timing") or {}
        for stage in STAGES:
            value = timing.get(stage)
            if isinstance(value, int | float) and stage != "encode_ms":
                self.stages[stage].append(float(value))
        if oc.latency_ms is not None:
            self.stages["latency_ms"].append(oc.latency_ms)
        if isinstance(timing.get("batch_size"), int | float):
            self.batch_sizes.append(float(timing["batch_size"]))

    def summary(self, wall_s: float) -> dict[str, Any]:
        answered = self.counts["answered"]
        return {
            "frames": self.frames,
            "answered": answered,
            "dropped": self.counts["dropped"],
            "error": self.counts["error"],
            "unanswered": self.counts["unanswered"],
            "error_codes": dict(self.error_codes),
            "wall_s": round(wall_s, 3),
            "fps": round(self.frames / wall_s, 2) if wall_s > 0 else 0.0,
            "answered_fps": round(answered / wall_s, 2) if wall_s > 0 else 0.0,
            "mean_batch_size": (
                round(sum(self.batch_sizes) / len(self.batch_sizes), 2)
                if self.batch_sizes
                else None
            ),
            "latency_ms": {s: p for s, v in self.stages.items() if (p := percentiles(v))},
        }
