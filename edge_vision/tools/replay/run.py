"""One replay run (:class:`Replay`): source → target → writer thread, with pacing,
Ctrl-C and the summary.

The asyncio shape: a producer reads and JPEG-encodes frames in a worker thread and offers
them (paced for ``--realtime``); a target (in-process or remote) delivers one
:class:`~.books.Outcome` per frame; :class:`~.books.InOrder` puts outcomes back in frame
order; one writer thread draws, encodes video and writes JSONL, so the event loop never
blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from ...common.aio import wait_event
from ...common.settings import Mode
from ...common.sources import FrameSource, SourceInfo, open_source
from ...errors import EdgeVisionError
from .books import Encoded, FrameRecord, InOrder, Outcome
from .local_target import LocalTarget
from .options import ReplayError, ReplayOptions
from .target import Target
from .writers import Recorder

if TYPE_CHECKING:
    from ...config import Config
    from .events import EventCounts, ReplayEvents

log = logging.getLogger("edge_vision.tools.replay")

#: Frames decoded and waiting for the writer thread before reading pauses.
WRITE_BACKLOG = 32


class Replay:
    """One replay: source → target → recorder, with pacing, Ctrl-C and the summary."""

    def __init__(self, opts: ReplayOptions, config: Config | None) -> None:
        self.opts = opts
        self.config = config
        self.stop = asyncio.Event()  # first Ctrl-C: read no more, finish frames in flight
        self.abort = asyncio.Event()  # second Ctrl-C: abandon frames in flight too
        self.signal_received: int | None = None
        self._order: InOrder[Outcome] = InOrder()
        self._encoded: dict[int, Encoded] = {}
        self._write_q: asyncio.Queue[FrameRecord | None] = asyncio.Queue()
        self._written = asyncio.Condition()
        self._all_settled = asyncio.Event()
        self._total: int | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="replay-writer")
        self.write_failure: ReplayError | None = None
        self.events: ReplayEvents | None = None  # the rules' events (--events, sinks)
        self.event_counts: EventCounts | None = None

    # outcomes arrive here, in any order, from the target
    def deliver(self, seq: int, outcome: Outcome) -> None:
        for s, oc in self._order.add(seq, outcome):
            self._write_q.put_nowait(FrameRecord(s, self._encoded.pop(s), oc))
        self._check_settled()

    async def run(self) -> tuple[dict[str, Any], int]:
        opts = self.opts
        loop = asyncio.get_running_loop()
        async with AsyncExitStack() as stack:
            if opts.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    stack.callback(loop.remove_signal_handler, sig)
            stack.push_async_callback(asyncio.to_thread, self._writer.shutdown, True)
            source = await asyncio.to_thread(open_source, opts.input, opts.cut)
            stack.push_async_callback(asyncio.to_thread, source.close)
            info = source.info
            mode: Mode = opts.mode or ("latest" if info.live else "every")
            self.events = events = await self._make_events()  # a sink's bad config fails here
            target = self._make_target(mode)
            stack.push_async_callback(target.close)
            await target.start()  # loads the model or connects: the likeliest failures
            if events is not None:
                await events.start()
                # After the writer (below) is done: the last events are in the outboxes.
                stack.push_async_callback(self._close_events, events)
            show = opts.progress if opts.progress is not None else sys.stderr.isatty()
            recorder = await loop.run_in_executor(
                self._writer,
                lambda: Recorder(info, opts.jsonl, opts.out, opts.codec, show, opts.events),
            )
            stack.push_async_callback(loop.run_in_executor, self._writer, recorder.close)
            writer_task = asyncio.create_task(self._write_all(recorder), name="replay-write")
            stack.push_async_callback(self._finish_writing, writer_task)
            # Closed before the writer finishes, so frames it still holds are written.
            stack.push_async_callback(target.close)
            started = time.perf_counter()
            failure = await self._produce(source, target, mode)
            wall_s = time.perf_counter() - started
        summary = self._summary(recorder, info, target, mode, wall_s)
        failure = failure or self.write_failure
        if failure is not None:
            summary["failure"] = str(failure)
        code = 128 + self.signal_received if self.signal_received else 0
        return summary, code

    async def _finish_writing(self, writer_task: asyncio.Task[None]) -> None:
        """Everything settled so far is written before the files close."""
        self._write_q.put_nowait(None)
        await writer_task

    async def _make_events(self) -> ReplayEvents | None:
        """The rules' events, when ``--events`` asks for them or the config has rules and
        sinks to deliver them to (docs/events.md, "Replay")."""
        config = self.config
        if config is None:
            if self.opts.events is None:
                return None
            # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
            from ...config import Config

            config = Config()
        if self.opts.events is None and not config.events.rules:
            return None
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...common.metrics import Metrics
        from .events import ReplayEvents

        events = ReplayEvents(config, await asyncio.to_thread(Metrics))
        if self.opts.events is None and events.hub is None:
            return None  # rules, but nowhere to tell: nothing to do
        if not events.rules.rules:
            log.warning("--events: the config has no rules (events.rules); none will be written")
        return events

    async def _close_events(self, events: ReplayEvents) -> None:
        self.event_counts = await events.close(self.opts.events_drain_s, self.abort)

    def _make_target(self, mode: Mode) -> Target:
        opts = self.opts
        if self.events is not None and self.events.needs_text and not opts.read:
            # A rule with text matches what was read: replay reads, as a session would.
            opts = dataclasses.replace(opts, read=True)
        if opts.url:
            # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
            from .remote_target import RemoteTarget  # the client and aiohttp: only with --url

            return RemoteTarget(opts, mode, self.deliver)
        if self.config is None:
            raise RuntimeError("in-process replay needs a Config")
        return LocalTarget(
            self.config,
            mode,
            opts.in_flight,
            opts.confidence,
            opts.classes,
            self.deliver,
            read=opts.read,
        )

    def _on_signal(self, sig: int) -> None:
        self.signal_received = self.signal_received or sig
        if not self.stop.is_set():
            log.warning("stopping: finishing the frames in flight (again to abandon them)")
            self.stop.set()
        else:
            self.abort.set()

    async def _produce(self, source: FrameSource, target: Target, mode: Mode) -> ReplayError | None:
        """Read, pace and offer frames until the source ends or Ctrl-C; then settle all."""
        info = source.info
        quality = self.opts.jpeg_quality
        seq = 0
        t0: float | None = None
        ts0 = 0.0

        def read_and_encode() -> Encoded | None:
            import simplejpeg

            frame = source.read()
            if frame is None:
                return None
            t = time.perf_counter()
            jpeg = simplejpeg.encode_jpeg(frame.pixels, quality=quality, colorspace="BGR")
            return Encoded(frame, jpeg, (time.perf_counter() - t) * 1000.0)

        while not self.stop.is_set() and not target.failed.is_set():
            async with self._written:  # the writer thread sets the pace if it is slowest
                await self._written.wait_for(lambda: self._write_q.qsize() <= WRITE_BACKLOG)
            enc = await asyncio.to_thread(read_and_encode)
            if enc is None:
                break
            if mode == "latest" and not info.live:
                # Offer each frame at its own time, as the camera would have.
                now = time.perf_counter()
                if t0 is None:
                    t0, ts0 = now, enc.frame.ts
                delay = t0 + (enc.frame.ts - ts0) / 1000.0 - now
                if delay > 0 and await wait_event(self.stop, delay):
                    break
            if self.stop.is_set():
                break
            self._encoded[seq] = enc
            await target.send(seq, enc)
            seq += 1

        self._total = seq
        self._check_settled()
        await self._settle_all(target)
        if target.failed.is_set():
            return target.failure or ReplayError(f"{target.description} failed")
        return None

    def _check_settled(self) -> None:
        if self._total is not None and self._order.next_seq >= self._total:
            self._all_settled.set()

    async def _settle_all(self, target: Target) -> None:
        """Wait until every offered frame is settled; a second Ctrl-C abandons the rest."""
        settled = asyncio.create_task(self._all_settled.wait())
        aborted = asyncio.create_task(self.abort.wait())
        try:
            await asyncio.wait({settled, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()
            aborted.cancel()
        if not self._all_settled.is_set():
            target.abort("interrupted")
            # Cancelled frames settle as their tasks unwind, within a loop iteration or two.
            if not await wait_event(self._all_settled, 10.0):
                raise RuntimeError("frames left unsettled after abort")

    async def _write_all(self, recorder: Recorder) -> None:
        """Feed the writer thread in frame order, with the events each frame raised (the
        rules run here, on the loop, in frame order; the tracks still live leave at the
        end). If writing fails (a full disk), stop reading and discard the rest, so
        nothing waits on a writer that is gone."""
        loop = asyncio.get_running_loop()
        events = self.events
        while True:
            record = await self._write_q.get()
            if self.write_failure is None:
                try:
                    if record is not None:
                        lines = events.observe(record) if events is not None else []
                        await loop.run_in_executor(self._writer, recorder.write, record, lines)
                    elif events is not None:  # the end: the live tracks leave
                        lines = events.finish()
                        await loop.run_in_executor(self._writer, recorder.write_events, lines)
                except (OSError, EdgeVisionError) as e:
                    self.write_failure = ReplayError(f"writing the outputs failed: {e}")
                    self.stop.set()
            if record is None:
                return
            async with self._written:
                self._written.notify_all()

    def _summary(
        self,
        recorder: Recorder,
        info: SourceInfo,
        target: Target,
        mode: Mode,
        wall_s: float,
    ) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "input": self.opts.input,
            "source": {
                "kind": info.kind,
                "width": info.width,
                "height": info.height,
                "fps": round(info.fps, 3),
                "live": info.live,
            },
            "target": target.description,
            "mode": mode,
            "interrupted": self.signal_received is not None,
            **recorder.stats.summary(wall_s),
            "outputs": {
                "video": str(self.opts.out) if self.opts.out else None,
                "video_frames": recorder.video_frames if self.opts.out else None,
                "jsonl": str(self.opts.jsonl) if self.opts.jsonl else None,
                "events": str(self.opts.events) if self.opts.events else None,
            },
        }
        if self.events is not None:
            counts = self.event_counts or self.events.counts
            summary["events"] = counts.summary(str(self.opts.events) if self.opts.events else None)
        if self.opts.url:  # the remote target's own counts
            # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
            from .remote_target import RemoteTarget

            assert isinstance(target, RemoteTarget)
            summary["wire"] = self.opts.wire
            summary["duplicates"] = target.duplicates
            summary["ts_mismatches"] = target.ts_mismatches
            summary["server_dropped"] = target.server_dropped
        return summary


async def replay(opts: ReplayOptions, config: Config | None = None) -> tuple[dict[str, Any], int]:
    """Run one replay; returns the summary and the exit code (0, or 128+signal)."""
    return await Replay(opts, config).run()
