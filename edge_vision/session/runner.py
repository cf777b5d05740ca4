"""The asyncio half of the session core: carries out :class:`~.core.SessionCore`'s
actions with the frame pipeline.

One :class:`SessionRunner` per session serves both shells that the core sits under: the
server's connection (edge_vision.serve.connection: frames read from a WebSocket, replies sent on
it) and replay's in-process target (edge_vision.tools.replay: frames from a clip, replies
delivered to the writer). Everything that decides is in the core; this module only turns
its actions into tasks:

* :class:`~.core.Process`: a task runs the frame through the pipeline's two steps,
  :meth:`~edge_vision.frames.pipeline.FramePipeline.prepare`, then (having reported ``prepared``
  to the core) :meth:`~edge_vision.frames.pipeline.FramePipeline.finish` with the core's
  supersede key, and reports ``result_ready`` (a :class:`~edge_vision.frames.pipeline.FrameResult`,
  or the :class:`~edge_vision.errors.ClientError` the frame earned) or, when finish
  answered :data:`~edge_vision.frames.infer.SUPERSEDED`, ``superseded``;
* :class:`~.core.Send`: the reply goes into one FIFO that a single sender task
  empties through the shell's ``send`` (so replies leave in the core's order), then
  ``sent``. When ``send`` raises :class:`ConnectionError` the client is gone: the sender
  stops, and :meth:`SessionRunner.admit` says so at once, also to a reader that was
  waiting for room (nothing would ever make room again), so the shell ends the session
  instead of holding its frames for good;
* :class:`~.core.Drop` and :class:`~.core.Release`: the shell's hooks
  (delivering "dropped" outcomes, giving a frame's bytes back to the memory budget) and
  the node's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from ..common.aio import cancel_and_wait
from ..common.messages import FrameMessage
from ..common.metrics import Metrics
from ..common.settings import Mode
from ..errors import ClientError, EngineError
from ..frames.infer import Superseded
from ..frames.pipeline import FramePipeline, FrameResult, FrameSettings
from ..frames.read import SessionReading
from .core import Action, Drop, Process, Release, Send, SessionCore, Ticket

log = logging.getLogger(__name__)

Reply = FrameResult | ClientError
FrameTicket = Ticket[FrameMessage, Reply]
FrameCore = SessionCore[FrameMessage, Reply]


class SessionRunner:
    """Runs one session's frames by its core's rules (see the module docstring).

    ``send(ticket)`` delivers ``ticket.reply`` (raise :class:`ConnectionError` when the
    client is gone: nothing more is sent, and :meth:`admit` answers False); ``on_drop``
    and ``on_release`` see the core's drops and releases; ``metrics``, when given, counts
    answered, dropped and rejected frames and each result's timing."""

    def __init__(
        self,
        core: FrameCore,
        pipeline: FramePipeline,
        *,
        settings: Callable[[], FrameSettings],
        send: Callable[[FrameTicket], Awaitable[None]],
        reading: Callable[[], SessionReading | None] = lambda: None,
        on_drop: Callable[[Drop[FrameMessage]], None] | None = None,
        on_release: Callable[[FrameMessage], None] | None = None,
        metrics: Metrics | None = None,
        name: str = "session",
    ) -> None:
        self.core = core
        self.pipeline = pipeline
        self._settings = settings
        self._send = send
        self._reading = reading
        self._on_drop = on_drop
        self._on_release = on_release
        self._metrics = metrics
        self._name = name
        self._outbox: asyncio.Queue[FrameTicket] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()  # set after every event: accepting, idle may differ
        self._client_gone = False  # send raised ConnectionError: no reply can be delivered
        # This session in the engine's queue, whose turns favour the session served least
        # recently (batch.py), and in the host decoders' fair turns (decode_turns.py): a
        # bare object, so their memory of turns holds nothing of the session once it is
        # gone.
        self._owner = object()

    # -- what the shell calls -----------------------------------------------------------

    def start(self) -> None:
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_in_order(), name=f"send-{self._name}")

    @property
    def client_gone(self) -> bool:
        """The shell's ``send`` raised ConnectionError: no reply can be delivered."""
        return self._client_gone

    async def admit(self, frame: FrameMessage) -> bool:
        """Admit a frame that passed its arrival checks; in ``every`` mode first waits for
        room in the queue (the shell reads nothing meanwhile: TCP back-pressure).

        False when the client is gone (:attr:`client_gone`), found before or while it
        waited: the frame is counted received and dropped, and the shell should end the
        session (:meth:`close`)."""
        core = self.core
        await self._wait_for(lambda: core.accepting or core.closed or self._client_gone)
        if core.closed:
            raise RuntimeError("admit() on a closed session")
        if self._client_gone:
            self._apply(core.abandoned(frame))
            return False
        self._apply(core.frame_arrived(frame))
        return True

    def mode_changed(self, mode: Mode) -> None:
        self._apply(self.core.mode_changed(mode))

    async def wait_idle(self) -> None:
        """Until nothing of this session waits or is in flight (graceful shutdown)."""
        await self._wait_for(lambda: self.core.idle)

    async def close(self) -> None:
        """The session ends: what was not sent is dropped (the core's books), every task
        stops, every frame is released."""
        actions = self.core.close()
        tasks = [*self._tasks, self._sender]
        for task in tasks:
            if task is not None:
                task.cancel()
        self._apply(actions)
        await cancel_and_wait(*tasks)

    def abort(self) -> None:
        """Stop every task now without waiting (replay's second Ctrl-C); :meth:`close`
        still counts and releases."""
        for task in self._tasks:
            task.cancel()

    # -- carrying out actions -----------------------------------------------------------

    def _apply(self, actions: Sequence[Action[FrameMessage, Reply]]) -> None:
        for action in actions:
            if isinstance(action, Process):
                task = asyncio.create_task(self._process(action.ticket, time.perf_counter()))
                self._tasks.add(task)
                task.add_done_callback(self._task_done)
            elif isinstance(action, Send):
                self._outbox.put_nowait(action.ticket)
            elif isinstance(action, Drop):
                if self._metrics is not None:
                    self._metrics.frames_dropped.inc(len(action.frames))
                if self._on_drop is not None:
                    self._on_drop(action)
            elif isinstance(action, Release) and self._on_release is not None:
                self._on_release(action.frame)
        self._changed.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            # A broken rule (the core refused an event): say so loudly, never silently
            # hold a place in flight.
            log.error("a frame task of %s failed", self._name, exc_info=e)

    async def _wait_for(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._changed.clear()
            await self._changed.wait()

    async def _process(self, ticket: FrameTicket, taken_at: float) -> None:
        frame, core = ticket.frame, self.core
        reply: Reply | Superseded
        try:
            reply = await self._serve(ticket, taken_at)
        except ClientError as e:
            reply = e.with_frame_id(frame.id)
        except EngineError as e:
            reply = ClientError("engine_unavailable", str(e), frame.id)
        except Exception:
            log.exception("frame %r of %s failed", frame.id, self._name)
            reply = ClientError("internal", "the server failed on this frame", frame.id)
        if isinstance(reply, Superseded):
            self._apply(core.superseded(ticket))
            return
        rejected = isinstance(reply, ClientError)
        if self._metrics is not None:
            if isinstance(reply, ClientError):
                self._metrics.frames_rejected.labels(reply.code).inc()
            else:
                self._metrics.observe_timing(reply.timing)
        self._apply(core.result_ready(ticket, reply, rejected=rejected))

    async def _serve(self, ticket: FrameTicket, taken_at: float) -> FrameResult | Superseded:
        frame, core, pipeline = ticket.frame, self.core, self.pipeline
        settings, reading = self._settings(), self._reading()
        try:
            prepared = await pipeline.prepare(frame, settings, owner=self._owner)
        finally:  # failed or cancelled, it no longer holds the decode turn either
            self._apply(core.prepared(ticket))
        return await pipeline.finish(
            frame,
            prepared,
            settings,
            taken_at,
            supersede_key=core.supersede_key(ticket),
            owner=self._owner,
            reading=reading,
        )

    async def _send_in_order(self) -> None:
        while True:
            ticket = await self._outbox.get()
            try:
                await self._send(ticket)
            except ConnectionError:
                # The client is gone: nothing sends the rest, so nothing would make room
                # for a reader waiting in admit(); wake it to say so.
                self._client_gone = True
                self._changed.set()
                return
            if not ticket.rejected and self._metrics is not None:
                self._metrics.frames_answered.inc()  # answered means delivered
            self._apply(self.core.sent(ticket))
