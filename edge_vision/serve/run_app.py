"""How a serving process runs its app: aiohttp's runner on the loop ``server.event_loop``
picks, on sockets bound before the model loads or handed over by the node's main process,
until SIGTERM or SIGINT (moved out of :mod:`.workers`, which starts the processes)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Sequence

from aiohttp import web

from ..common.aio import cancel_and_wait
from ..errors import ConfigError
from .balance import take_handed

log = logging.getLogger(__name__)


def run_app(
    app: web.Application,
    loop: asyncio.AbstractEventLoop,
    *,
    listeners: Sequence[socket.socket],
    handed_over: socket.socket | None,
    shutdown_timeout: float,
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT as aiohttp's ``web.run_app`` does (its runner,
    graceful shutdown, the loop closed at the end), on the ``listeners`` bound before
    (:func:`.listen.listen`) or on the connections the main process hands over
    ``handed_over`` (server.worker_balance), with
    one difference: the first SIGTERM or SIGINT starts the shutdown and later ones are
    ignored. A supervisor that signals every process of the node gives each worker two
    (its own and the one the main process forwards); in ``run_app`` the second raises
    inside the graceful close and cuts the sessions' 1001 close short."""

    async def main() -> None:
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=shutdown_timeout,
            keepalive_timeout=75.0,  # run_app's; the app's handler_args take precedence
        )
        stop_taking: Callable[[], None] | None = None
        try:
            await runner.setup()
            if handed_over is None:
                for sock in listeners:
                    await web.SockSite(runner, sock).start()
            else:
                server = runner.server
                if server is None:  # pragma: no cover - setup() made it
                    raise RuntimeError("the app runner has no server")
                stop_taking = take_handed(app, server, handed_over, loop)
            await stopping.wait()
        finally:
            if stop_taking is not None:
                stop_taking()
            await runner.cleanup()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)  # exiting: a late one must not kill it

    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main())
    finally:
        loop.run_until_complete(cancel_and_wait(*asyncio.all_tasks(loop)))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio.set_event_loop(None)


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A serving process's event loop (``server.event_loop``)."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError as e:
            raise ConfigError(f"server.event_loop uvloop: pip install uvloop ({e})") from e
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    log.info("event loop: %s", type(loop).__module__.split(".")[0])
    return loop
