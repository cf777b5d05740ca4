"""The events of a replay: the node's rules (``events.rules``, zones, lines: the same config
sections ``serve`` reads) over the answered frames of the video, in frame order, written
to ``--events`` (one JSON event a line) and, when ``events.sinks`` names any, delivered to
them through the node's own hub and outboxes (:class:`~edge_vision.events.hub.EventHub`).

One rule engine: the rules are :class:`~edge_vision.events.session_rules.SessionRules`,
the tracks :class:`~edge_vision.frames.track.Tracker`, the events
:func:`~edge_vision.events.event.event_body`, as a server session runs them. What differs
is the clock: the tracker, ``dwell``, ``every``'s interval and ``leave``'s keep time run
on the video's own time (each frame's ``ts``), so a clip gives the same events however
fast this machine answers it; an event's ``at`` is this machine's clock when the rule
fired. The tracks still live when the video ends leave then, as at a session's end.

The same for in-process and ``--url`` replays: the rules read each frame's result as the
protocol's ``result`` message carries it (a running server's own rules are its business).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ...common.messages import FrameMessage
from ...common.metrics import Metrics
from ...config import Config
from ...events.event import event_body
from ...events.hub import CropJob, EventHub
from ...events.rules import Firing
from ...events.session_rules import SessionRules
from ...events.sinks import build_sinks
from ...frames.track import Tracker
from .books import FrameRecord

log = logging.getLogger("edge_vision.tools.replay")

#: Seconds between the lines that tell how the sinks' outboxes drain at the end.
_PROGRESS_S = 2.0
#: How often the drain at the end looks at the outboxes.
_POLL_S = 0.05


@dataclass(slots=True)
class SinkCounts:
    """What became of one sink's events by the end of the replay."""

    delivered: int = 0
    dropped: int = 0  # the outbox was full (its oldest went) or the sink refused them
    undelivered: int = 0  # still in the outbox when the drain's time ran out


@dataclass(slots=True)
class EventCounts:
    """The summary's ``events``: per rule, and per sink."""

    rules: dict[str, int]
    sinks: dict[str, SinkCounts] = field(default_factory=dict)

    def summary(self, path: str | None) -> dict[str, Any]:
        return {
            "total": sum(self.rules.values()),
            "rules": dict(self.rules),
            "jsonl": path,
            "sinks": {
                name: {"delivered": c.delivered, "dropped": c.dropped, "undelivered": c.undelivered}
                for name, c in self.sinks.items()
            },
        }


class ReplayEvents:
    """See the module docstring. On the event loop: :meth:`observe` each answered frame
    in frame order, :meth:`finish` once the video ended, :meth:`close` to drain the
    sinks."""

    def __init__(self, config: Config, metrics: Metrics, session: str | None = None) -> None:
        """``metrics``: a registry of the replay's own (its sinks' counts are read there;
        made off the loop: :class:`Metrics` looks at the board it runs on)."""
        self.config = config
        self.node = config.state.node_id or f"{socket.gethostname()}-replay"
        self.session = session or secrets.token_hex(8)
        self._labels: dict[int, str] = {}
        self.rules = SessionRules.build(config.events, None, self._label)
        self._crops = any(r.crop for r in self.rules.rules)
        self.tracker = Tracker()
        self.tracker.reports_ended = True
        self.counts = EventCounts({r.name: 0 for r in self.rules.rules})
        self._metrics = metrics
        sinks = build_sinks(config.events, config.state, client_id=f"edge-vision-{self.node}")
        self.hub = EventHub(config.events, sinks, self._metrics) if sinks else None
        self._last_t = 0.0
        self._finished = False

    def _label(self, cls: int) -> str:
        return self._labels.get(cls, str(cls))

    @property
    def needs_text(self) -> bool:
        """A rule has ``text``: the frames must be read (``--read``)."""
        return self.rules.needs_text

    @property
    def sink_names(self) -> list[str]:
        return [s.name for s in self.hub.sinks] if self.hub is not None else []

    async def start(self) -> None:
        """Open the sinks' outboxes and start delivering (the hub's own tasks)."""
        if self.hub is not None:
            await self.hub.start()

    # -- frames in ----------------------------------------------------------------------

    def observe(self, record: FrameRecord) -> list[bytes]:
        """One settled frame, in frame order: the JSONL lines of the events it raised
        (each also sent to the sinks). Frames without a result raise nothing."""
        oc = record.outcome
        if oc.status != "answered" or oc.result is None or not self.rules.rules:
            return []
        result = oc.result
        dets = result.get("detections") or []
        rows = np.zeros((len(dets), 6), dtype=np.float64)
        texts: list[str | None] | None = None
        for i, d in enumerate(dets):
            cls = int(d.get("class", 0))
            rows[i, :4] = d["box"]
            rows[i, 4] = d.get("score", 0.0)
            rows[i, 5] = cls
            if "label" in d:
                self._labels[cls] = str(d["label"])
            if "text" in d:
                texts = texts if texts is not None else [None] * len(dets)
                texts[i] = d["text"]
        frame = record.encoded.frame
        ts = result.get("ts", frame.ts)
        t = _seconds(ts, frame.ts)  # the video's own time: the rules' clock
        self._last_t = max(self._last_t, t)
        ids = self.tracker.update(rows, t).tolist()
        width = int(result.get("width") or frame.pixels.shape[1])
        height = int(result.get("height") or frame.pixels.shape[0])
        _, fired = self.rules.observe(
            rows, ids, texts, width, height, t, result.get("id", frame.index), ts
        )
        ended = self.tracker.take_ended()
        if ended:
            fired += self.rules.ended(ended, t)
        crop = None
        if fired and self._crops:  # what a rule with crop: true cuts its JPEG from
            crop = FrameMessage(frame.index, ts, record.encoded.jpeg, False, time.perf_counter())
        return self._raise(fired, crop)

    def finish(self) -> list[bytes]:
        """The video ended: every live track leaves (``leave``), as at a session's end."""
        if self._finished or not self.rules.rules:
            return []
        self._finished = True
        t = self._last_t
        ended = sorted(set(self.tracker.end_all() + self.tracker.take_ended()))
        fired = self.rules.ended(ended, t) + self.rules.end_all(t)
        return self._raise(fired, None)

    def _raise(self, fired: list[Firing], frame: FrameMessage | None) -> list[bytes]:
        lines = []
        for f in fired:
            body = event_body(f, self.node, self.session)
            body["at"] = round(time.time(), 3)  # firing.at is the video's clock
            self.counts.rules[f.rule.name] = self.counts.rules.get(f.rule.name, 0) + 1
            if self.hub is not None:
                crop = CropJob(frame, f.obs.box) if f.rule.crop and frame is not None else None
                self.hub.emit(dict(body), crop, source="node")  # the hub may add the crop
            lines.append(orjson.dumps(body) + b"\n")
        return lines

    # -- the end ------------------------------------------------------------------------

    async def close(self, drain_s: float, abort: asyncio.Event | None = None) -> EventCounts:
        """Wait up to ``drain_s`` (or until ``abort`` is set) for the sinks to take every
        event, telling how it goes on stderr every few seconds; then stop the hub. What is
        left stays in the outbox file with ``events.outbox_dir`` (the next run, or
        ``serve``, delivers it), and is counted undelivered."""
        hub = self.hub
        if hub is None:
            return self.counts
        deadline = time.monotonic() + drain_s
        tell_at = time.monotonic()
        told = False
        while (waiting := hub.waiting()) and not (abort is not None and abort.is_set()):
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= tell_at:
                shown = ", ".join(f"{name} {n}" for name, n in waiting.items())
                print(
                    f"replay: {sum(waiting.values())} events waiting for the sinks ({shown}); "
                    f"up to {deadline - now:.0f} s more",
                    file=sys.stderr,
                    flush=True,
                )
                told, tell_at = True, now + _PROGRESS_S
            await asyncio.sleep(_POLL_S)
        await hub.close()
        for name in self.sink_names:
            self.counts.sinks[name] = SinkCounts(
                delivered=int(self._sample("delivered_total", sink=name)),
                dropped=int(
                    self._sample("dropped_total", sink=name, reason="outbox_full")
                    + self._sample("dropped_total", sink=name, reason="rejected")
                ),
                undelivered=len(hub.outboxes[name]),
            )
        if told:
            print("replay: done waiting for the sinks", file=sys.stderr, flush=True)
        return self.counts

    def _sample(self, name: str, **labels: str) -> float:
        value = self._metrics.registry.get_sample_value(f"edge_vision_events_{name}", labels)
        return value or 0.0


def _seconds(ts: Any, fallback: float) -> float:
    """A frame's ``ts`` (milliseconds) as seconds."""
    value = ts if isinstance(ts, int | float) and not isinstance(ts, bool) else fallback
    return float(value) / 1000.0
