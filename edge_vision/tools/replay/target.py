"""Where replay's frames are answered: the :class:`Target` interface, which the in-process
target (:mod:`.local_target`) and a running server (:mod:`.remote_target`) both keep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from .books import Encoded, Outcome
from .options import ReplayError

#: How a target hands back one frame's outcome: ``deliver(seq, outcome)``, in any order.
Deliver = Callable[[int, Outcome], None]


class Target(Protocol):
    description: str
    failure: ReplayError | None  # why the target cannot go on (set before ``failed``)
    failed: asyncio.Event

    async def start(self) -> None: ...

    async def send(self, seq: int, enc: Encoded) -> None:
        """Offer one frame; may wait (every-frame back-pressure, send window)."""
        ...

    def abort(self, reason: str) -> None:
        """Settle every unsettled frame as unanswered (second Ctrl-C, failures)."""
        ...

    async def close(self) -> None: ...
