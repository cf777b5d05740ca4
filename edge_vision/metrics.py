"""Prometheus metrics, one registry per app (so several apps in one process never clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

STAGES = ("decode", "shape", "queue", "batch_wait", "infer", "post", "server")
_LATENCY_BUCKETS = (
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


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
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
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            p + "batch_size",
            "Frames per engine batch",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
            registry=r,
        )
        self.batch_wait_seconds = Histogram(
            p + "batch_wait_seconds",
            "Oldest frame's wait in the batcher",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_infer_seconds = Histogram(
            p + "batch_infer_seconds",
            "Engine time per batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.connections = Gauge(p + "connections", "Open WebSocket connections", registry=r)
        self.connections_closed = Counter(
            p + "connections_closed",
            "Connections closed by the server, by reason",
            ["reason"],
            registry=r,
        )
        self.engine_degraded = Gauge(
            p + "engine_degraded", "1 while serving on the fallback engine", registry=r
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

    def observe_timing(self, timing: dict[str, float]) -> None:
        for stage in STAGES:
            v = timing.get(stage + "_ms")
            if v is not None:
                self.stage_seconds.labels(stage).observe(v / 1000.0)

    def observe_batch(self, size: int, infer_s: float, wait_s: float) -> None:
        self.batch_size.observe(size)
        self.batch_infer_seconds.observe(infer_s)
        self.batch_wait_seconds.observe(wait_s)

    def set_engine(self, active: str | None, degraded: bool) -> None:
        for kind in ("onnxruntime", "torch", "tensorrt", "triton"):
            self.engine_active.labels(kind).set(1 if kind == active else 0)
        self.engine_degraded.set(1 if degraded else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
