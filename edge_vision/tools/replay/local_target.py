"""Replay in-process: frames answered by the server's own objects (InferenceService,
FramePipeline) under the server's own session core and runner, with the server's limits;
only the socket is missing."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import orjson

from ...common.messages import FrameMessage
from ...common.settings import Mode
from ...engines.choice import resolve_engine
from ...errors import ClientError
from .books import Encoded, Outcome
from .options import ReplayError
from .target import Deliver

if TYPE_CHECKING:
    from ...config import Config
    from ...frames.infer import InferenceService
    from ...frames.pipeline import FramePipeline
    from ...frames.read import SessionReading
    from ...session.core import Drop
    from ...session.runner import FrameCore, FrameTicket, SessionRunner


class LocalTarget:
    """In-process: the server's own InferenceService and FramePipeline, under the server's
    own session core (edge_vision.session.core) with the same limits; only the socket is
    missing, so in-process replay measures exactly what the server does."""

    def __init__(
        self,
        config: Config,
        mode: Mode,
        in_flight: int | None,
        confidence: float | None,
        classes: list[int] | None,
        deliver: Deliver,
        *,
        read: bool = False,
    ) -> None:
        self.config = config = resolve_engine(config)  # the engine serve would run here
        self.mode = mode
        self._read = read
        self.deliver = deliver
        self._in_flight_opt = in_flight
        self._confidence = config.model.confidence if confidence is None else confidence
        self._classes = frozenset(classes) if classes is not None else None
        self.description = f"in-process {config.engine.kind}"
        self.failure: ReplayError | None = None  # an in-process engine degrades, never fails
        self.failed = asyncio.Event()
        self.service: InferenceService | None = None
        self.pipeline: FramePipeline | None = None
        self._runner: SessionRunner | None = None
        self._reading: SessionReading | None = None
        self._seqs: dict[int, int] = {}  # id(frame message) -> seq, until it is settled
        self._closed = False

    async def start(self) -> None:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...frames.infer import InferenceService
        from ...frames.pipeline import FramePipeline, FrameSettings
        from ...frames.track import Tracker
        from ...model.spec import load_model_spec
        from ...session.core import SessionCore
        from ...session.runner import SessionRunner

        cfg = self.config
        spec = await asyncio.to_thread(load_model_spec, cfg.model)
        self.service = InferenceService(spec, cfg)
        await self.service.start()
        self.pipeline = FramePipeline(cfg, self.service)
        settings = FrameSettings(self._confidence, self._classes)
        reading = None
        if self._read:  # as a server session with read on; fails here, not per frame
            await self.pipeline.reading.reader()
            # The session's tracker, fed in frame order as the server's connection does.
            self._reading = reading = self.pipeline.reading.session(Tracker())
        engine = self.service.engine
        self.description = f"in-process {engine.kind if engine else cfg.engine.kind}"
        # The server's own rules and limits for a connection (docs/protocol.md, Admission);
        # --in-flight overrides session.every_in_flight.
        core: FrameCore = SessionCore.from_config(
            self.mode, cfg.session, every_in_flight=self._in_flight_opt
        )
        self._runner = SessionRunner(
            core,
            self.pipeline,
            settings=lambda: settings,
            send=self._answer,
            reading=lambda: reading,
            on_drop=self._dropped,
            name="replay",
        )
        self._runner.start()

    async def send(self, seq: int, enc: Encoded) -> None:
        if self._runner is None:
            raise RuntimeError("LocalTarget used before start()")
        msg = FrameMessage(enc.frame.index, enc.frame.ts, enc.jpeg, False, time.perf_counter())
        self._seqs[id(msg)] = seq
        await self._runner.admit(msg)  # 'every' waits for room in the queue

    async def _answer(self, ticket: FrameTicket) -> None:
        """The core's Send: this reply is next in frame order (the server would send it)."""
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...frames.pipeline import FrameResult
        from ...session import reply

        res, msg = ticket.reply, ticket.frame
        if isinstance(res, ClientError):
            outcome = Outcome("error", error={"code": res.code, "message": res.message})
        elif isinstance(res, FrameResult) and self.service is not None and self._runner:
            if self._reading is not None and res.texts is not None:  # as connection.py
                tracks = self._reading.tracker.update(res.detections, msg.received_at)
                self._reading.settle(tracks.tolist(), res.detections, res.texts)
            latency = (time.perf_counter() - msg.received_at) * 1000.0
            dropped = self._runner.core.books.dropped
            result = orjson.loads(reply.result(res, self.service.spec.label, dropped))
            outcome = Outcome("answered", result=result, latency_ms=latency)
        else:
            raise RuntimeError(f"frame {msg.id!r} has no reply to deliver")
        self._settle(msg, outcome)

    def _dropped(self, drop: Drop[FrameMessage]) -> None:
        # 'closed' only when replay stops before every frame settled (a failure).
        for msg in drop.frames:
            if drop.reason == "closed":
                self._settle(msg, Outcome("unanswered", reason="interrupted"))
            else:
                self._settle(msg, Outcome("dropped", reason="dropped"))

    def _settle(self, msg: FrameMessage, outcome: Outcome) -> None:
        seq = self._seqs.pop(id(msg), None)
        if seq is not None:  # None: settled already (an abort)
            self.deliver(seq, outcome)

    def abort(self, reason: str) -> None:
        for seq in sorted(self._seqs.values()):
            self.deliver(seq, Outcome("unanswered", reason=reason))
        self._seqs.clear()
        if self._runner is not None:
            self._runner.abort()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            await self._runner.close()
        if self.service is not None:
            await self.service.close()
        if self.pipeline is not None:
            await self.pipeline.close()
