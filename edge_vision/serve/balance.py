"""Connections spread evenly over a node's worker processes (``server.worker_balance``).

With ``server.workers`` > 1 every worker serves the same port. Left to the kernel
(``reuse-port``: each worker listens with SO_REUSEPORT), a connection goes to the worker its
address hashes to, so some workers get several times the cameras of others, and the
busiest worker's GIL sets the whole node's tail (docs/benchmarks.md, "a fair host path, and
where the GIL goes"). With ``least-clients`` (the default) the node's main process listens
and accepts, and hands each connection's socket (SCM_RIGHTS over a Unix datagram pair, one
a worker) to the worker with the fewest clients:

    client --TCP--> main process: accept --fd--> worker w: the same aiohttp server as ever

* :func:`hand_order` decides, without I/O: the fewest clients by the last beat plus those
  handed to it since (handed minus what its beat says it received), lowest index on a
  tie, among the warm workers under a fair share (while others still warm up, the rest go
  to those, which ask the client to come back: see its docstring).
* :class:`Balancer` is the main process's side: its listening sockets and a thread that
  accepts and hands over.
* :func:`take_handed` is a worker's side: the handed sockets fed to the app runner's own
  server (``loop.connect_accepted_socket``), so graceful shutdown closes them as it
  closes any other (the worker's serving shell: ``run_app.run_app``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from .app_keys import STATE
from .listen import listen

log = logging.getLogger(__name__)

#: How long a hand-over may wait for room in a worker's queue before the next worker
#: takes the connection (a worker's loop that stalled, or died).
HAND_TIMEOUT_S = 1.0
#: How long the accepting thread pauses when accept() fails for want of descriptors or
#: buffers (asyncio's servers pause a second).
ACCEPT_PAUSE_S = 1.0
_PAUSE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def estimates(clients: Sequence[int], handed: Sequence[int], received: Sequence[int]) -> list[int]:
    """Each worker's clients now, as best the main process knows: its last beat's, plus
    the sockets handed to it that the beat had not counted yet."""
    return [c + max(0, h - r) for c, h, r in zip(clients, handed, received, strict=True)]


def hand_order(
    clients: Sequence[int], handed: Sequence[int], received: Sequence[int], warm: Sequence[bool]
) -> list[int]:
    """The workers in the order they should get the next connection; the rest (by the
    same estimate) take it when the ones before cannot (gone, or a full queue).

    ``clients``: each worker's clients at its last beat; ``handed``: sockets handed to it
    so far; ``received``: how many of those its last beat said it had taken in;
    ``warm``: whether its engine is warm. The fewest clients goes first, among the warm
    workers under a fair share (``ceil((all clients + 1) / workers)``); past that, while
    others still warm up, the connection goes to one of them (which answers 503 with
    Retry-After until it is warm): otherwise the first warm worker after a restart would
    take every reconnecting camera, and WebSockets never move afterwards."""
    est = estimates(clients, handed, received)
    fair = -(-(sum(est) + 1) // len(est))
    by_load = sorted(range(len(est)), key=lambda i: (est[i], i))
    first = [i for i in by_load if warm[i] and est[i] < fair] or by_load
    return [first[0], *(i for i in by_load if i != first[0])]


class Balancer:
    """The main process's listening sockets on ``host``:``port`` and the thread that
    accepts connections and hands each to a worker (first of :func:`hand_order`)."""

    def __init__(self, host: str | None, port: int, workers: int, backlog: int = 1024) -> None:
        self.listeners = listen(host, port, backlog=backlog)  # raises ListenFailed
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(workers)]
        self._to_worker = [mine for mine, _ in pairs]
        for mine in self._to_worker:  # a wedged worker's full queue must not stop accepting
            mine.settimeout(HAND_TIMEOUT_S)
        #: The worker ends, passed to the worker processes (then closed here).
        self.worker_ends = [theirs for _, theirs in pairs]
        self._lock = threading.Lock()
        self._clients = [0] * workers
        self._received = [0] * workers
        self.handed = [0] * workers
        self._warm: Callable[[int], bool] = lambda _i: False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gone: set[int] = set()  # workers whose end refused a hand-over

    def record(self, worker: int, clients: int, received: int) -> None:
        """A worker's beat: its clients and how many handed sockets it has taken in."""
        with self._lock:
            self._clients[worker] = clients
            self._received[worker] = received

    def start(self, warm: Callable[[int], bool]) -> None:
        self._warm = warm
        self._thread = threading.Thread(target=self._run, name="balance", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """The accepting thread ended without being asked to: the node accepts nothing."""
        t = self._thread
        return t is not None and not t.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        try:
            with selectors.DefaultSelector() as sel:
                for sock in self.listeners:
                    sel.register(sock, selectors.EVENT_READ)
                while not self._stop.is_set():
                    for key, _ in sel.select(timeout=0.2):
                        self._accept(key.fileobj)  # type: ignore[arg-type]
        except Exception:
            log.exception("the connection balancer stopped")
            raise
        finally:
            for sock in self.listeners:  # no new connections once it stops
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _addr = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as e:
            if self._stop.is_set():
                return
            # Out of descriptors or buffers: wait a little, as asyncio's server does.
            log.error("accepting a connection failed: %s", e)
            if e.errno in _PAUSE_ERRNOS:
                time.sleep(ACCEPT_PAUSE_S)
            return
        with conn:
            self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        with self._lock:
            order = hand_order(self._clients, self.handed, self._received, self._warm_list())
        # A worker that cannot take it (gone, or its queue full) is passed over for the
        # next in order, and a gone worker gets none again.
        for i in order:
            if i in self._gone:
                continue
            try:
                socket.send_fds(self._to_worker[i], [b"c"], [conn.fileno()])
            except OSError as e:
                log.warning("could not hand a connection to worker w%d: %s", i, e)
                if e.errno in (errno.ECONNREFUSED, errno.ENOTCONN, errno.EPIPE):
                    self._gone.add(i)
                continue
            with self._lock:
                self.handed[i] += 1
            return
        log.error("no worker took a connection; closing it")

    def _warm_list(self) -> list[bool]:
        return [bool(self._warm(i)) for i in range(len(self._to_worker))]

    def stop(self) -> None:
        """Stop accepting within a select timeout (safe in a signal handler: no waiting)."""
        self._stop.set()

    def close(self) -> None:
        """Stop, wait for the accepting thread, and close what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for sock in (*self.listeners, *self._to_worker):
            sock.close()


def _receive(handed_over: socket.socket) -> list[socket.socket]:
    """The sockets waiting on a worker's end (non-blocking; none when there are none)."""
    got: list[socket.socket] = []
    while True:
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(handed_over, 16, 16)
        except (BlockingIOError, InterruptedError):
            return got
        for fd in fds:
            sock = socket.socket(fileno=fd)
            sock.set_inheritable(False)  # SCM_RIGHTS gives it without close-on-exec
            sock.setblocking(False)
            got.append(sock)


def take_handed(
    app: web.Application,
    server: web.Server,
    handed_over: socket.socket,
    loop: asyncio.AbstractEventLoop,
) -> Callable[[], None]:
    """Serve the connections the main process hands over ``handed_over`` on ``server``
    (the app runner's: graceful shutdown closes them as it closes any other), counting
    them in the app's state (``NodeState.handed``, for the beats). Returns what stops taking."""
    handed_over.setblocking(False)
    app[STATE].handed = 0

    def take() -> None:
        for sock in _receive(handed_over):
            app[STATE].handed += 1
            task = loop.create_task(loop.connect_accepted_socket(server, sock))
            task.add_done_callback(_log_failure)

    loop.add_reader(handed_over.fileno(), take)

    def stop() -> None:
        loop.remove_reader(handed_over.fileno())
        handed_over.close()

    return stop


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a handed connection could not be served: %s", task.exception())
