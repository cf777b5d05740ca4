"""The node's processes and its systemd contract (sd_notify(3)), for one worker or many.

What systemd sees (a unit with ``Type=notify``, ``WatchdogSec=`` and ``NotifyAccess=main``;
docs/jetson.md, "systemd and the watchdog"):

- ``READY=1`` once every worker has finished starting: its engine is loaded and warmed up,
  or it failed with ``engine.fallback: none`` and the node stays up, degraded, answering
  /healthz and saying why in /readyz (a Triton outage must not become a restart loop).
- ``WATCHDOG=1`` every ``WatchdogSec/2`` while every worker's event loop is alive. Each
  worker sends a beat from its event loop every :func:`beat_interval_s`; the node pings
  only while the last beat of every worker is younger than :func:`stale_after_s`, so a
  wedged loop (a blocking call, a SIGSTOPped process) in any worker stops the pings and
  systemd restarts the node. Liveness, not engine readiness: a degraded engine keeps
  the pings going and shows in ``STATUS=``.
- ``STATUS=`` lines a person reads in ``systemctl status``: engine, clients, frames per
  second, degraded and why. Sent when the state changes and every :data:`STATUS_EVERY_S`.
- ``STOPPING=1`` as soon as SIGTERM (or SIGINT) arrives.

With one worker the node is the one process and its loop does all of this itself. With
``server.workers`` > 1 the parent process is the node: workers put their beats on a
queue, the parent decides, and what a worker's own code notifies (a TensorRT build's
``EXTEND_TIMEOUT_USEC`` and ``STATUS=``) is relayed by the parent, because systemd accepts
messages from the main process only (``NotifyAccess=main``). The decisions are made by
:class:`NodeMonitor`, which does no I/O.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..common import systemd
from ..common.aio import cancel_and_wait, with_timeout
from ..common.memory import settle_startup_heap, tune_serving_process
from ..config import Config
from ..engines.choice import describe_choice, resolve_engine
from ..errors import ConfigError, ListenFailed
from .app_keys import CONNECTIONS, METRICS, SERVICE, STARTUP, STATE
from .balance import Balancer
from .gpu_node import GpuNode, start_gpu_processes
from .listen import bound_port, listen, where_to_connect
from .run_app import new_event_loop, run_app
from .server import create_app

log = logging.getLogger(__name__)

#: A STATUS= line is re-sent at least this often (fps changes), and at once on a change.
STATUS_EVERY_S = 5.0
#: How often a worker asks its engine whether it can serve (a Triton round trip).
HEALTH_EVERY_S = 5.0
#: States only the node (the main process) sends; a worker's attempts are not relayed.
NODE_ONLY = ("READY=", "WATCHDOG=", "STOPPING=", "MAINPID=")


def beat_interval_s(watchdog_s: float | None) -> float:
    """How often each worker's loop beats: twice per watchdog ping, at least once a second."""
    return min(1.0, watchdog_s / 2) if watchdog_s else 1.0


def stale_after_s(watchdog_s: float | None) -> float:
    """A worker whose last beat is older than this counts as wedged: no more pings.

    One ping interval plus one beat: a loop stalled for longer than about half of
    ``WatchdogSec`` stops the pings, and systemd acts within ``WatchdogSec`` after that.
    """
    beat = beat_interval_s(watchdog_s)
    return (watchdog_s + beat) if watchdog_s else math.inf


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's state, sent from its event loop (so its arrival proves the loop runs)."""

    worker: int
    pid: int
    started: bool  # the engine start-up finished, successfully or not
    ready: bool  # frames can be served
    engine: str  # the active engine, or the configured one while none is active
    problem: str | None  # why the node is degraded or not serving; None when all is well
    clients: int
    answered: float  # frames answered since start (the frames_answered counter)
    received: int = 0  # connections the main process handed it (server.worker_balance)


class NodeMonitor:
    """The node's state from its workers' beats: ready, alive, and the STATUS= line."""

    def __init__(self, workers: int, stale_after: float) -> None:
        self.workers = workers
        self.stale_after = stale_after
        self._beats: dict[int, WorkerBeat] = {}
        self._seen: dict[int, float] = {}
        self._fps_mark: tuple[float, float] | None = None  # (time, frames answered)
        self.fps = 0.0

    def record(self, beat: WorkerBeat, now: float) -> None:
        self._beats[beat.worker] = beat
        self._seen[beat.worker] = now

    def all_started(self) -> bool:
        return len(self._beats) == self.workers and all(b.started for b in self._beats.values())

    def stale(self, now: float) -> list[int]:
        """Workers without a fresh beat (never beaten, or silent for ``stale_after``)."""
        return [
            i for i in range(self.workers) if now - self._seen.get(i, -math.inf) > self.stale_after
        ]

    def alive(self, now: float) -> bool:
        """Every worker's loop beat recently: the watchdog may be pinged."""
        return not self.stale(now)

    def update_fps(self, now: float) -> float:
        """Frames per second answered by the whole node since the previous call."""
        total = sum(b.answered for b in self._beats.values())
        if self._fps_mark is not None and now > self._fps_mark[0]:
            self.fps = max(0.0, total - self._fps_mark[1]) / (now - self._fps_mark[0])
        self._fps_mark = (now, total)
        return self.fps

    def status_line(self, now: float, stopping: bool = False) -> str:
        """What ``systemctl status`` shows on its "Status:" line."""
        beats = [self._beats[i] for i in sorted(self._beats)]
        if stopping:
            return "stopping: finishing frames in flight, closing connections"
        if not self.all_started():
            started = sum(b.started for b in beats)
            return f"starting: engine warming up ({started} of {self.workers} workers started)"
        engines = ", ".join(sorted({b.engine for b in beats}))
        clients = sum(b.clients for b in beats)
        stale = self.stale(now)
        problems = sorted({b.problem for b in beats if b.problem})
        if stale:
            state = f"unresponsive: worker {', '.join(map(str, stale))} sent no beat"
        elif problems:
            state = f"degraded ({'; '.join(problems)})"
        else:
            state = "ready"
        plural = "" if clients == 1 else "s"
        return f"{state}: engine {engines}, {clients} client{plural}, {self.fps:.1f} fps"


class NodeNotifier:
    """Drives systemd from a :class:`NodeMonitor`: READY once, WATCHDOG while alive, STATUS."""

    def __init__(
        self,
        workers: int,
        watchdog_s: float | None,
        notify: Callable[[str], object] = systemd.notify,
    ) -> None:
        self.monitor = NodeMonitor(workers, stale_after_s(watchdog_s))
        self.watchdog_s = watchdog_s
        self._notify = notify
        self.ready_sent = False
        self.stopping = False
        self._next_ping = 0.0
        self._next_status = 0.0
        self._last_state = ""
        self._warned_stale = False
        self._last_line = ""

    def record(self, beat: WorkerBeat, now: float) -> None:
        self.monitor.record(beat, now)

    def relayed_status(self, now: float) -> None:
        """A worker's own STATUS= (a plan build's progress) went out: keep it up for a
        while unless the node's state changes."""
        self._next_status = now + STATUS_EVERY_S

    def stop(self) -> None:
        """SIGTERM arrived: say so at once (systemd's stop timeout starts now)."""
        if not self.stopping:
            self.stopping = True
            self._notify("STOPPING=1")
            self._notify("STATUS=" + self.monitor.status_line(time.monotonic(), stopping=True))

    def tick(self, now: float) -> None:
        if self.stopping:
            return
        m = self.monitor
        if not self.ready_sent and m.all_started():
            self.ready_sent = True
            self._next_ping = now
            self._send_status(now)
            self._notify("READY=1")
            log.info("node ready (%s)", self._last_line)
        if self.ready_sent and self.watchdog_s and now >= self._next_ping:
            if m.alive(now):
                self._notify("WATCHDOG=1")
                self._warned_stale = False
            elif not self._warned_stale:
                self._warned_stale = True
                log.error(
                    "worker %s sent no beat for %.1f s: its event loop is stuck; "
                    "no watchdog pings until it answers",
                    ", ".join(map(str, m.stale(now))),
                    m.stale_after,
                )
            self._next_ping = max(self._next_ping + self.watchdog_s, now)  # no catch-up burst
        state = m.status_line(now).split(":", 1)[0]
        if now >= self._next_status or state != self._last_state:
            self._send_status(now)

    def _send_status(self, now: float) -> None:
        self.monitor.update_fps(now)
        self._last_line = self.monitor.status_line(now)
        self._last_state = self._last_line.split(":", 1)[0]
        self._next_status = now + STATUS_EVERY_S
        self._notify("STATUS=" + self._last_line)


# -- inside each worker's event loop ----------------------------------------------------


class WorkerReporter:
    """Beats from one worker's event loop; the beats' arrival is the loop's liveness."""

    def __init__(self, index: int, emit: Callable[[WorkerBeat], None], beat_s: float) -> None:
        self.index = index
        self.emit = emit
        self.beat_s = beat_s
        self._problem: str | None = None

    def attach(self, app: web.Application, on_warm: Callable[[], object] | None = None) -> None:
        """Beat while ``app`` runs; call ``on_warm`` once its engine is warm."""

        async def ctx(app: web.Application) -> AsyncIterator[None]:
            tasks = [
                asyncio.create_task(self._beat(app, on_warm), name="beat"),
                asyncio.create_task(self._probe(app), name="health-probe"),
            ]
            yield
            await cancel_and_wait(*tasks)

        app.cleanup_ctx.append(ctx)

    def beat_of(self, app: web.Application) -> WorkerBeat:

        st = app[SERVICE].status
        startup = app.get(STARTUP)
        started = startup is not None and startup.done()
        startup_error = app[STATE].startup_error
        if startup_error:
            problem: str | None = f"engine {st.configured} failed to start: {startup_error}"
        elif st.degraded:
            problem = st.reason or f"degraded from {st.configured}"
        elif started and not st.ready:
            problem = st.reason or "engine not ready"
        else:
            problem = self._problem  # the engine's own health answer (Triton's readiness)
        answered = app[METRICS].registry.get_sample_value("edge_vision_frames_answered_total")
        return WorkerBeat(
            worker=self.index,
            pid=os.getpid(),
            started=started,
            ready=st.ready,
            engine=st.active or f"{st.configured} (not running)",
            problem=problem,
            clients=len(app[CONNECTIONS]),
            answered=answered or 0.0,
            received=app[STATE].handed,
        )

    async def _beat(self, app: web.Application, on_warm: Callable[[], object] | None) -> None:

        warm_reported = False
        while True:
            startup = app.get(STARTUP)
            if not warm_reported and startup is not None and startup.done():
                warm_reported = True
                if on_warm is not None and not startup.cancelled() and not startup.exception():
                    on_warm()
            self.emit(self.beat_of(app))
            await asyncio.sleep(self.beat_s)

    async def _probe(self, app: web.Application) -> None:
        """Ask the engine whether it serves (e.g. Triton's model readiness) now and then.

        Off the beat's path: a slow answer must not delay the beat."""

        service = app[SERVICE]
        while True:
            await asyncio.sleep(HEALTH_EVERY_S)
            startup = app.get(STARTUP)
            if startup is None or not startup.done() or not service.status.ready:
                continue
            try:
                self._problem = await with_timeout(service.health(), HEALTH_EVERY_S)
            except TimeoutError:
                self._problem = f"engine health check took over {HEALTH_EVERY_S:g} s"


# -- running the node -------------------------------------------------------------------


def run_node(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, telling systemd READY/WATCHDOG/STATUS/STOPPING.

    With ``server.workers`` > 1, that many processes serve the port, each with its own
    event loop and engine, under a parent that speaks for the node and hands each new
    connection to the worker with the fewest clients (``server.worker_balance``,
    :mod:`.balance`). ``engine.kind: auto`` is resolved here, before the workers start, so
    they all run the engine (and the worker count) it derives."""
    config = resolve_engine(config)
    if config.server.workers > 1:
        _run_workers(config)
        return
    # Bound before the model loads: a port in use is one line at once (ListenFailed).
    listeners = listen(config.server.host, config.server.port)
    _say_where(config, bound_port(listeners, config.server.port))
    watchdog = systemd.watchdog_interval_s()
    notifier = NodeNotifier(1, watchdog)

    def on_beat(beat: WorkerBeat) -> None:
        now = time.monotonic()
        notifier.record(beat, now)
        notifier.tick(now)

    gpu = start_gpu_processes(config)  # server.gpu_process: before the worker connects
    try:
        _serve(
            config,
            WorkerReporter(0, on_beat, beat_interval_s(watchdog)),
            notifier.stop,
            listeners=listeners,
            gpu=gpu[1] if gpu else None,
        )
    finally:
        if gpu is not None:
            gpu[0].stop()


def _say_where(config: Config, port: int) -> None:
    """Once per node, when its port is bound: where to connect, and who may."""
    server = config.server
    log.info(describe_choice(config))
    log.info(where_to_connect(server.host, port, config.auth.enabled, socket.gethostname()))


def _serve(
    config: Config,
    reporter: WorkerReporter,
    on_stop: Callable[[], object] | None,
    *,
    listeners: Sequence[socket.socket] = (),
    handed_over: socket.socket | None = None,
    on_warm: Callable[[], object] | None = None,
    workers_warm: Callable[[], bool] | None = None,
    gpu: GpuNode | None = None,
) -> None:

    tune_serving_process(config.server.mmap_threshold_bytes)
    app = create_app(config, gpu_process=gpu)
    if workers_warm is not None:
        app[STATE].workers_warm = workers_warm
    app[STATE].on_engine_started = settle_startup_heap
    reporter.attach(app, on_warm)
    if on_stop is not None:

        async def say_stopping(_app: web.Application) -> None:
            on_stop()

        app.on_shutdown.insert(0, say_stopping)  # before frames in flight are awaited
    run_app(
        app,
        new_event_loop(config.server.event_loop),
        listeners=listeners,
        handed_over=handed_over,
        shutdown_timeout=config.server.shutdown_grace_s + 2,
    )


def _worker_main(
    config_json: str,
    index: int,
    warm: Sequence[Any],
    beats: Any,
    beat_s: float,
    handed_over: socket.socket | None = None,
    gpu: GpuNode | None = None,
) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s w{index} %(name)s: %(message)s"
    )
    config = Config.model_validate_json(config_json)
    if config.state.node_id:
        config.state.node_id = f"{config.state.node_id}-w{index}"
    if config.events.outbox_dir is not None:  # each worker delivers its own events
        config.events.outbox_dir = config.events.outbox_dir / f"w{index}"
    # What this worker's code notifies (a plan build's progress) goes to the parent.
    systemd.set_relay(lambda state: beats.put(("notify", index, state)))

    def emit(beat: WorkerBeat) -> None:
        beats.put(("beat", index, beat))  # never blocks: a feeder thread writes the pipe

    listeners: list[socket.socket] = []
    if handed_over is None:  # server.worker_balance reuse-port: each worker listens
        try:
            listeners = listen(config.server.host, config.server.port, reuse_port=True)
        except ListenFailed as e:  # the main process's check passed; something took it since
            log.error("%s", e)
            raise SystemExit(2) from None
    _serve(
        config,
        WorkerReporter(index, emit, beat_s),
        None,
        listeners=listeners,
        handed_over=handed_over,
        on_warm=warm[index].set,
        workers_warm=lambda: all(e.is_set() for e in warm),
        gpu=gpu,
    )


def _run_workers(config: Config) -> None:
    import multiprocessing as mp

    if config.server.port == 0:
        raise ConfigError("server.workers > 1 needs a fixed server.port: the workers share it")
    watchdog = systemd.watchdog_interval_s()
    beat_s = beat_interval_s(watchdog)
    ctx = mp.get_context("spawn")
    n = config.server.workers
    warm = [ctx.Event() for _ in range(n)]
    beats: Any = ctx.Queue()
    # server.worker_balance least-clients: this process listens and hands each
    # connection to the worker with the fewest clients (edge_vision/serve/balance.py).
    balancer = None
    if config.server.worker_balance == "least-clients":
        balancer = Balancer(config.server.host, config.server.port, n)  # raises ListenFailed
    else:  # each worker listens; a port in use is said here, once, before any starts
        for sock in listen(config.server.host, config.server.port, reuse_port=True):
            sock.close()
    _say_where(config, config.server.port)
    ends: list[socket.socket | None] = list(balancer.worker_ends) if balancer else [None] * n
    gpu = start_gpu_processes(config)  # server.gpu_process: before the workers connect
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(config.model_dump_json(), i, warm, beats, beat_s, ends[i]),
            kwargs={"gpu": gpu[1].for_worker(i) if gpu else None},
            name=f"w{i}",
        )
        for i in range(n)
    ]
    for p in procs:
        p.start()
    for end in ends:  # each worker holds its own copy now
        if end is not None:
            end.close()
    log.info("workers started: %s", ", ".join(f"w{i} pid {p.pid}" for i, p in enumerate(procs)))
    if balancer is not None:
        balancer.start(lambda i: warm[i].is_set())
        log.info("connections go to the worker with the fewest clients (server.worker_balance)")
    notifier = NodeNotifier(n, watchdog)

    def stop_node(signum: int) -> None:
        """Say STOPPING, accept no more (no waiting: it runs in the signal handler too)
        and pass ``signum`` to every worker still running."""
        notifier.stop()
        if balancer is not None:
            balancer.stop()
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signum)

    def on_signal(signum: int, _frame: Any) -> None:
        stop_node(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tick_s = min(0.1, beat_s / 2)
    while any(p.is_alive() for p in procs):
        for kind, _index, payload in _drain(beats, tick_s):
            if kind == "beat":
                notifier.record(payload, time.monotonic())
                if balancer is not None:
                    balancer.record(payload.worker, payload.clients, payload.received)
            elif not str(payload).startswith(NODE_ONLY):
                systemd.notify(str(payload))
                if "STATUS=" in str(payload):  # also after an EXTEND_TIMEOUT_USEC= line
                    notifier.relayed_status(time.monotonic())
        notifier.tick(time.monotonic())
        if balancer is not None and balancer.failed and not notifier.stopping:
            log.error("the connection balancer stopped; stopping the node")
            stop_node(signal.SIGTERM)  # a node that accepts nothing: let systemd restart it
        if any(p.exitcode not in (None, 0) for p in procs) and not notifier.stopping:
            dead = [f"w{i} (exit {p.exitcode})" for i, p in enumerate(procs) if p.exitcode]
            log.error("worker %s died; stopping the node", ", ".join(dead))
            stop_node(signal.SIGTERM)  # one worker died: stop all, let systemd restart it
    for p in procs:
        p.join()
    if gpu is not None:  # its workers are gone: it stops at once
        gpu[0].stop()
    if balancer is not None:
        balancer.close()
    notifier.stop()
    beats.close()
    if any(p.exitcode for p in procs):
        raise SystemExit(1)


def _drain(beats: Any, timeout: float) -> list[tuple[str, int, Any]]:
    """Every message waiting on the queue, waiting up to ``timeout`` for the first."""
    got: list[tuple[str, int, Any]] = []
    try:
        got.append(beats.get(timeout=timeout))
        while True:
            got.append(beats.get_nowait())
    except (queue.Empty, EOFError, OSError):  # EOF/OSError: a worker died mid-message
        pass
    return got
