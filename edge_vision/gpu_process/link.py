"""A worker's connection to one GPU process of its node.

:class:`GpuLink` connects to the GPU process's Unix socket, says hello with its ring's file
descriptor (SCM_RIGHTS), submits frames placed in the ring and resolves each frame's
future with its answer, freeing its ring record then (the GPU process reads a record
until it answers it). It reconnects by itself, every :data:`RETRY_S`, for as long as the
worker runs: the node's main process restarts a GPU process that died or hung.

When the connection ends (the GPU process died, was killed for a hang, or stopped), every
frame this worker had handed it is answered at once: its future raises
:class:`~edge_vision.errors.EngineUnavailable` ("the GPU process stopped ...", which the
session answers as ``engine_unavailable``, counted rejected), never left waiting; until a
GPU process is back and ready, :meth:`GpuLink.submit` refuses at once the same way (the
worker's pipeline waits for it before submitting: :mod:`.handoff`). The connections stay
open meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..common.aio import cancel_and_wait
from ..common.settings import FrameSettings
from ..errors import EngineUnavailable
from . import wire
from .ring import Record, RingWriter

log = logging.getLogger(__name__)

#: How often a worker tries its GPU process again while it is gone.
RETRY_S = 0.2


@dataclass(slots=True)
class _Sent:
    future: asyncio.Future[wire.Result]
    record: Record


class GpuLink:
    """See the module docstring. The worker's event loop alone uses it."""

    def __init__(
        self,
        path: str,
        ring: RingWriter,
        worker: int,
        *,
        on_change: Callable[[], None] | None = None,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.ring = ring
        self.worker = worker
        self.status: dict[str, Any] = {}
        self.connected = False
        self.connections = 0  # connections made (a second one is a restarted GPU process)
        self.losses = 0  # connections that ended while the worker ran
        self.failed_frames = 0  # frames in flight answered at once when one ended
        self._on_change = on_change
        self._on_free = on_free
        self._writer: asyncio.StreamWriter | None = None
        self._sent: dict[int, _Sent] = {}
        self._seqs = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def ready(self) -> bool:
        return self.connected and bool(self.status.get("ready"))

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    @property
    def failed(self) -> str | None:
        """Why the GPU process cannot serve, when it said so (its engine did not start)."""
        if self.connected and self.status and not self.status.get("ready"):
            reason = self.status.get("reason")
            return str(reason) if reason and self.status.get("failed") else None
        return None

    def describe(self) -> dict[str, Any]:
        st = self.status
        return {
            "state": "ready" if self.ready else ("starting" if self.connected else "gone"),
            "pid": st.get("pid"),
            "gpu": st.get("gpu"),
            "stand_in": st.get("stand_in"),
            "engine": st.get("active") or st.get("configured"),
            "connections": self.connections,
            "losses": self.losses,
            "frames_failed": self.failed_frames,
            "in_flight": self.in_flight,
        }

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"gpu-link-{self.path}")

    async def close(self) -> None:
        self._closing = True
        await cancel_and_wait(self._task)
        self._lost("the worker is stopping")

    # -- frames ----------------------------------------------------------------------

    def submit(
        self,
        record: Record,
        session: int,
        settings: FrameSettings,
        *,
        latest: bool,
        quads: bool,
        raw: bool = False,
    ) -> tuple[int, asyncio.Future[wire.Result]]:
        """Hand the frame in ``record`` over; its answer comes on the future (with ``raw``,
        the engine's outputs for it: the worker post-processes them). Raises
        EngineUnavailable at once when no ready GPU process is connected (``record``
        stays the caller's then)."""
        writer = self._writer
        if writer is None or not self.ready:
            raise EngineUnavailable(_why_not(self.status, self.connected))
        seq = next(self._seqs)
        fut: asyncio.Future[wire.Result] = asyncio.get_running_loop().create_future()
        self._sent[seq] = _Sent(fut, record)
        message = wire.Submit(
            seq,
            record,
            session,
            latest,
            quads,
            settings.confidence,
            settings.input_size,
            settings.classes,
            raw,
        )
        writer.write(message.encode())
        return seq, fut

    def cancel(self, seq: int) -> None:
        """The frame's caller went away: the GPU process drops it if it has not started
        it; its record is freed when the answer comes."""
        if seq in self._sent and self._writer is not None and not self._writer.is_closing():
            self._writer.write(wire.cancel(seq))

    def _answered(self, result: wire.Result) -> None:
        sent = self._sent.pop(result.seq, None)
        if sent is None:
            return
        self.ring.free(sent.record)
        if not sent.future.done():
            sent.future.set_result(result)
        if self._on_free is not None:
            self._on_free()

    def _lost(self, why: str) -> None:
        """The connection ended: every frame in flight is answered now."""
        was = self.connected
        self.connected = False
        self._writer = None
        self.status = {}
        sent, self._sent = self._sent, {}
        for s in sent.values():
            self.ring.free(s.record)  # the GPU process that read it is gone
            if not s.future.done():
                s.future.set_exception(EngineUnavailable(why))
        if was and not self._closing:
            self.losses += 1
            self.failed_frames += len(sent)
            log.error(
                "the GPU process (%s) is gone; %d frame(s) in flight answered "
                "engine_unavailable; waiting for its restart",
                self.path,
                len(sent),
            )
        if sent and self._on_free is not None:
            self._on_free()
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    # -- the connection --------------------------------------------------------------

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, self.path)
            hello = wire.Hello(self.worker, os.getpid(), self.ring.capacity).encode()
            # A few bytes into an empty socket buffer: never blocks.
            socket.send_fds(sock, [hello], [self.ring.segment.fd])
            return await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    async def _run(self) -> None:
        stopped = "the GPU process stopped while this frame was in it; it is being restarted"
        while True:
            try:
                reader, writer = await self._connect()
            except OSError:
                await asyncio.sleep(RETRY_S)
                continue
            self._writer = writer
            self.connected = True
            self.connections += 1
            try:
                while True:
                    kind, body = await wire.read_message(reader)
                    if kind == wire.RESULT:
                        self._answered(wire.Result.decode(body))
                    elif kind == wire.STATUS:
                        self.status = wire.decode_status(body)
                        self._changed()
            except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
                pass
            finally:
                writer.close()
                self._lost(stopped)
            await asyncio.sleep(RETRY_S)


def _why_not(status: dict[str, Any], connected: bool) -> str:
    if not connected:
        return "the GPU process is restarting; retry in a few seconds"
    return f"the GPU process is not ready: {status.get('reason') or 'warming up'}"
