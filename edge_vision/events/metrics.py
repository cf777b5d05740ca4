"""The events' metrics on ``/metrics`` (docs/events.md, "Metrics"), registered on the app's
registry through :meth:`edge_vision.common.metrics.Metrics.extension`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class EventMetrics:
    """Events raised, and per sink: delivered, retried, dropped, queued, latency, up."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "edge_vision_events_"
        r = registry
        self.raised = Counter(
            p + "raised",
            "Events the rules raised, by kind and by whose rule (node: events.rules; session: "
            "a session's own)",
            ["on", "source"],
            registry=r,
        )
        self.delivered = Counter(
            p + "delivered",
            "Events a sink took (MQTT PUBACK, XADD, HTTP 2xx)",
            ["sink"],
            registry=r,
        )
        self.retried = Counter(
            p + "retried",
            "Deliveries that failed and will be tried again (the sink down or refusing)",
            ["sink"],
            registry=r,
        )
        self.dropped = Counter(
            p + "dropped",
            "Events a sink will never get: outbox_full (the oldest went to make room), "
            "rejected (the sink refused it for good: HTTP 4xx)",
            ["sink", "reason"],
            registry=r,
        )
        self.queued = Gauge(p + "queued", "Events waiting in a sink's outbox", ["sink"], registry=r)
        self.up = Gauge(
            p + "sink_up", "1 while the sink's last delivery succeeded", ["sink"], registry=r
        )
        self.latency = Histogram(
            p + "delivery_seconds",
            "From the rule firing to the sink taking the event",
            ["sink"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.crops_skipped = Counter(
            p + "crops_skipped",
            "Events sent without their crop: crops were being made for too many at once",
            registry=r,
        )
