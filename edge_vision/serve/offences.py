"""What a connection that had to be closed for not reading costs its address: counted,
logged once, and one strike towards the address's penalty (:class:`~.limits.PenaltyBox`,
``limits.slow_client_strikes`` / ``limits.slow_client_penalty_s``, docs/security.md)."""

from __future__ import annotations

import logging

from aiohttp import web

from .app_keys import ADDRESS, CONFIG, METRICS, PENALTIES

log = logging.getLogger(__name__)


class Offences:
    """One connection's part in its address's penalty (limits.PenaltyBox): one strike,
    whether it was closed for not reading its results, reset for not taking its close
    (websocket.py), or both."""

    def __init__(self, request: web.Request) -> None:
        self.app = request.app
        self.address = request.get(ADDRESS) or request.remote or ""
        self.struck = False

    def reset(self, unsent: int) -> None:
        self.app[METRICS].connections_reset.inc()
        log.info(
            "client %s had not taken the last %d bytes sent to it %g s after its connection "
            "was closed (server.close_timeout_s); the connection is reset",
            self.address,
            unsent,
            self.app[CONFIG].server.close_timeout_s,
        )
        self.strike()

    def strike(self) -> None:
        if self.struck:
            return
        self.struck = True
        box = self.app[PENALTIES]
        if box.strike(self.address):
            log.warning(
                "client %s is refused for %g s: %d of its connections were closed for not "
                "reading (limits.slow_client_strikes, limits.slow_client_penalty_s)",
                self.address,
                box.penalty_s,
                box.strikes,
            )
