"""The interface every sink implements, and the error a delivery stops with."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..outbox import Queued


class SinkError(Exception):
    """A delivery stopped: ``taken`` events of the batch were delivered before it.
    ``rejected``: the next one was refused for good (it is dropped, the rest go on);
    otherwise the sink is down and the rest is tried again later."""

    def __init__(self, message: str, taken: int = 0, *, rejected: bool = False) -> None:
        super().__init__(message)
        self.taken = taken
        self.rejected = rejected


class Sink(ABC):
    """One destination of events."""

    #: The sink's name in metrics, logs and the outbox: mqtt, redis or webhook.
    name: str
    #: Events handed to one :meth:`send`.
    batch = 64

    @abstractmethod
    async def send(self, items: Sequence[Queued]) -> None:
        """Deliver ``items`` in order (connecting first if needed); raise
        :class:`SinkError` saying how many were taken when not all were."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Let go of connections."""

    def describe(self) -> str:
        """Where it delivers, without secrets (for the start-up log)."""
        return self.name
