"""Connections spread evenly over a node's worker processes (``server.worker_balance``).

With ``server.workers`` > 1 every worker serves the same port. Left to the kernel
(``reuse-port``: each worker listens with SO_REUSEPORT), a connection goes to the worker its
address hashes to, so 64 cameras on 12 workers landed 2 on one worker and 8 on another
(the H200, 2026-12-02, docs/benchmarks.md): the busiest worker's GIL set the whole node's
tail. With ``least-clients`` (the default) the node's main process listens and accepts,
and hands each connection's socket (SCM_RIGHTS over a Unix datagram pair, one a worker) to
the worker with the fewest clients:

    client --TCP--> main process: accept --fd--> worker w: the same aiohttp server as ever

* :func:`pick_worker` decides, without I/O: among the workers whose engine is warm (all of
  them while none is), the fewest clients by the last beat plus those handed to it since
  (handed minus what its beat says it received), lowest index on a tie.
* :class:`Balancer` is the main process's side: its listening sockets and a thread that
  accepts and hands over.
* :func:`serve_handed` is a worker's side: aiohttp's ``run_app`` loop handling, with the
  handed sockets fed to the app's own server (``loop.connect_accepted_socket``), so
  graceful shutdown closes them as it closes any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

#: The app state key (``server.STATE``) where a worker counts the sockets handed to it.
HANDED = "connections_handed"


def pick_worker(
    clients: Sequence[int], handed: Sequence[int], received: Sequence[int], warm: Sequence[bool]
) -> int:
    """The worker to get the next connection (see the module docstring).

    ``clients``: each worker's clients at its last beat; ``handed``: sockets handed to it
    so far; ``received``: how many of those its last beat said it had taken in;
    ``warm``: whether its engine is warm."""
    candidates = [i for i, w in enumerate(warm) if w] or list(range(len(clients)))
    return min(candidates, key=lambda i: (clients[i] + max(0, handed[i] - received[i]), i))


class Balancer:
    """The main process's listening sockets on ``host``:``port`` and the thread that
    accepts connections and hands each to a worker (:func:`pick_worker`)."""

    def __init__(self, host: str | None, port: int, workers: int, backlog: int = 1024) -> None:
        self.listeners = _listen(host, port, backlog)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(workers)]
        self._to_worker = [mine for mine, _ in pairs]
        #: The worker ends, passed to the worker processes (then closed here).
        self.worker_ends = [theirs for _, theirs in pairs]
        self._lock = threading.Lock()
        self._clients = [0] * workers
        self._received = [0] * workers
        self.handed = [0] * workers
        self._warm: Callable[[int], bool] = lambda _i: False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, worker: int, clients: int, received: int) -> None:
        """A worker's beat: its clients and how many handed sockets it has taken in."""
        with self._lock:
            self._clients[worker] = clients
            self._received[worker] = received

    def start(self, warm: Callable[[int], bool]) -> None:
        self._warm = warm
        self._thread = threading.Thread(target=self._run, name="balance", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            for sock in self.listeners:
                sel.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    listener: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        conn, _addr = listener.accept()
                    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                        continue
                    except OSError:
                        if self._stop.is_set():
                            return
                        log.exception("accepting a connection failed")
                        continue
                    with conn:
                        self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        n = len(self._to_worker)
        with self._lock:
            order = [pick_worker(self._clients, self.handed, self._received, self._warm_list())]
        # A worker that has gone (its end closed) gets none: the next best takes it.
        order += [i for i in range(n) if i not in order]
        for i in order:
            try:
                socket.send_fds(self._to_worker[i], [b"c"], [conn.fileno()])
            except OSError as e:
                log.warning("could not hand a connection to worker w%d: %s", i, e)
                continue
            with self._lock:
                self.handed[i] += 1
            return
        log.error("no worker took a connection; closing it")

    def _warm_list(self) -> list[bool]:
        return [bool(self._warm(i)) for i in range(len(self._to_worker))]

    def close(self) -> None:
        """Stop accepting (a no-op the second time); the workers' ends stay theirs."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for sock in (*self.listeners, *self._to_worker):
            sock.close()


def _listen(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (all interfaces for
    None or ""), as aiohttp's TCP site binds them."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _name, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _receive(handed_over: socket.socket) -> tuple[list[socket.socket], bool]:
    """The sockets waiting on a worker's end (non-blocking), and whether the main
    process's end is still there (an empty message: it closed)."""
    got: list[socket.socket] = []
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(handed_over, 16, 16)
        except (BlockingIOError, InterruptedError):
            return got, True
        for fd in fds:
            sock = socket.socket(fileno=fd)
            sock.setblocking(False)
            got.append(sock)
        if not msg and not fds:
            return got, False


def serve_handed(
    app: web.Application,
    handed_over: socket.socket,
    *,
    loop: asyncio.AbstractEventLoop,
    shutdown_timeout: float,
) -> None:
    """Serve ``app`` on the connections handed over ``handed_over`` until SIGTERM/SIGINT,
    as ``web.run_app`` serves a listening socket: its runner, signal handling and
    graceful shutdown, and its loop closed at the end."""
    from .server import STATE

    async def main() -> None:
        runner = web.AppRunner(
            app, handle_signals=True, access_log=None, shutdown_timeout=shutdown_timeout
        )
        await runner.setup()
        server = runner.server
        if server is None:  # pragma: no cover - setup() made it
            raise RuntimeError("the app runner has no server")
        handed_over.setblocking(False)
        app[STATE][HANDED] = 0

        def take() -> None:
            socks, open_ = _receive(handed_over)
            for sock in socks:
                app[STATE][HANDED] += 1
                task = loop.create_task(loop.connect_accepted_socket(server, sock))
                task.add_done_callback(_log_failure)
            if not open_:  # the main process has stopped handing connections over
                loop.remove_reader(handed_over.fileno())

        loop.add_reader(handed_over.fileno(), take)
        try:
            await asyncio.Event().wait()  # until GracefulExit or cancellation
        finally:
            loop.remove_reader(handed_over.fileno())
            handed_over.close()
            await runner.cleanup()

    main_task = loop.create_task(main())
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main_task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main_task.done():
            main_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(main_task)
        rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in rest:
            t.cancel()
        if rest:
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio.set_event_loop(None)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a handed connection could not be served: %s", task.exception())
