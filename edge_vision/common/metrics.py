"""Prometheus metrics, one registry per app (so several apps in one process never clash)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .budget import KINDS, MemoryBudget
from .buffers import BufferPool
from .jetson_metrics import register_jetson_collector

T = TypeVar("T")

# "read": since protocol 2, frames of sessions reading text (read.py)
STAGES = ("decode", "shape", "queue", "batch_wait", "infer", "post", "read", "server")
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


def _loop_tasks() -> int:
    """Tasks of the running event loop (a scrape is rendered on it); 0 off the loop."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_kinds: Sequence[str] = ()) -> None:
        """``engine_kinds``: every kind ``engine.kind`` accepts, so ``engine_active`` has a
        series (0 or 1) for each (the config's :func:`~edge_vision.config.engine_kinds`)."""
        self._engine_kinds = tuple(engine_kinds)
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._extensions: dict[Callable[[CollectorRegistry], Any], Any] = {}
        p = "edge_vision_"
        self.frames_received = Counter(p + "frames_received", "Frames received", registry=r)
        self.frames_answered = Counter(p + "frames_answered", "Frames answered", registry=r)
        self.frames_dropped = Counter(
            p + "frames_dropped", "Frames replaced by a newer one (latest-wins)", registry=r
        )
        self.frames_rejected = Counter(
            p + "frames_rejected",
            "Messages answered with an error, by code",
            ["code"],
            registry=r,
        )
        self.stage_seconds = Histogram(
            p + "stage_seconds",
            "Per-stage latency",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Children looked up once: .labels() per frame and stage costs a lock and a dict.
        self._stage_children = {s: self.stage_seconds.labels(s) for s in STAGES}
        self.batch_size = Histogram(
            p + "batch_size",
            "Frames per engine batch",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
            registry=r,
        )
        self.decode_batch_size = Histogram(
            p + "decode_batch_size",
            "Frames per GPU decode call (decode.device; decode.device_window_ms fills them)",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=r,
        )
        self.batch_wait_seconds = Histogram(
            p + "batch_wait_seconds",
            "Oldest frame's wait in the batcher",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_infer_seconds = Histogram(
            p + "batch_infer_seconds",
            "Engine time per batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.connections = Gauge(p + "connections", "Open WebSocket connections", registry=r)
        self.read_pauses = Counter(
            p + "read_pauses",
            "Times a connection's reading paused because it was over its message budget "
            "(session.max_messages_per_s)",
            registry=r,
        )
        self.read_paused_seconds = Counter(
            p + "read_paused_seconds",
            "Seconds connections spent not reading because they were over their message budget",
            registry=r,
        )
        self.connections_closed = Counter(
            p + "connections_closed",
            "Connections closed by the server, by reason",
            ["reason"],
            registry=r,
        )
        self.connections_reset = Counter(
            p + "connections_reset",
            "Closed connections reset because the client did not take what was still being "
            "sent within server.close_timeout_s",
            registry=r,
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "WebSocket handshakes refused with 503 by a connection limit (docs/security.md)",
            ["limit"],
            registry=r,
        )
        # The memory budget (budget.py); gauges read the budget when scraped (watch_memory).
        self.memory_budget = Gauge(
            p + "memory_budget_bytes", "This process's memory budget for frames", registry=r
        )
        self.memory_held = Gauge(
            p + "memory_held_bytes",
            "Bytes held in the memory budget, by kind (frames, decode, pool)",
            ["kind"],
            registry=r,
        )
        self.memory_peak = Gauge(
            p + "memory_peak_bytes", "Most bytes the memory budget ever held at once", registry=r
        )
        self.memory_waiting = Gauge(
            p + "memory_waiting_bytes",
            "Bytes of frames whose reader waits for room in the budget (not yet counted)",
            registry=r,
        )
        self.memory_pool_idle = Gauge(
            p + "memory_pool_idle_bytes", "Idle buffers kept by the decode pool", registry=r
        )
        self.loop_tasks = Gauge(
            p + "event_loop_tasks", "asyncio tasks alive on the serving loop", registry=r
        )
        self.loop_tasks.set_function(_loop_tasks)
        self.memory_waits = Counter(
            p + "memory_waits",
            "Times an 'every' frame's reader paused for room in the memory budget",
            registry=r,
        )
        self.engine_degraded = Gauge(
            p + "engine_degraded", "1 while serving on the fallback engine", registry=r
        )
        self.engine_max_batch = Gauge(
            p + "engine_max_batch",
            "Largest batch the serving engine runs (engine.max_batch, narrowed by the model "
            "or the engine)",
            registry=r,
        )
        self.engine_active = Gauge(
            p + "engine_active",
            "The engine serving frames (1 for the active kind)",
            ["kind"],
            registry=r,
        )
        self.state_write_failures = Counter(
            p + "state_write_failures", "State store writes that failed", registry=r
        )
        self.state_degraded = Gauge(
            p + "state_degraded", "1 while the state store is unreachable", registry=r
        )
        # Board figures, on a Jetson only (jetson_metrics.py); None elsewhere: no series.
        self.jetson = register_jetson_collector(r)

    def watch_memory(self, budget: MemoryBudget, pool: BufferPool) -> None:
        """Export ``budget`` and ``pool``: read at each scrape, nothing per frame."""
        self.memory_budget.set(budget.limit)
        for kind in KINDS:
            self.memory_held.labels(kind).set_function(partial(budget.held_by, kind))
        self.memory_peak.set_function(lambda: budget.peak)
        self.memory_waiting.set_function(lambda: budget.waiting)
        self.memory_pool_idle.set_function(lambda: pool.free_bytes)

    def observe_timing(self, timing: dict[str, float]) -> None:
        for stage, child in self._stage_children.items():
            v = timing.get(stage + "_ms")
            if v is not None:
                child.observe(v / 1000.0)

    def observe_batch(self, size: int, infer_s: float, wait_s: float) -> None:
        self.batch_size.observe(size)
        self.batch_infer_seconds.observe(infer_s)
        self.batch_wait_seconds.observe(wait_s)

    def set_engine(self, active: str | None, degraded: bool, max_batch: int) -> None:
        for kind in {*self._engine_kinds, *([active] if active else [])}:
            self.engine_active.labels(kind).set(1 if kind == active else 0)
        self.engine_degraded.set(1 if degraded else 0)
        self.engine_max_batch.set(max_batch)

    def extension(self, factory: Callable[[CollectorRegistry], T]) -> T:
        """The app's instance of an engine's own metrics (``factory(registry)``, e.g.
        :class:`edge_vision.engines.triton.TritonMetrics`), made on first use and then
        shared by every engine of that kind the app loads: a retry after a degrade makes
        a new engine, not new series (which the registry would refuse)."""
        found = self._extensions.get(factory)
        if found is None:
            found = self._extensions[factory] = factory(self.registry)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
