"""The state store interface. Records are flat ``str -> str`` mappings, like Redis hashes.

Every implementation keeps the same three kinds of entry (names and TTLs: docs/state.md):

* a node record, expiring ``node_ttl_s`` after its last refresh;
* the set of session ids a node holds, with the node's TTL;
* a session record, expiring ``ttl_s`` after its last write.

Session writes are conditional on the session's ``epoch`` (:mod:`edge_vision.session.record`):
a write older than what the store holds is refused, and reported back, so the newest
holder of a session always wins whatever order writes arrive in. The contract is pinned
by ``tests/integration/test_state_store.py``, which runs against every implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Record = dict[str, str]
WriteKind = Literal["live", "released", "ended"]


@dataclass(frozen=True, slots=True)
class SessionWrite:
    """One change to one session record.

    ``live``: the node holds it (record written, id added to the node's set);
    ``released``: its socket closed but it may resume (record written, id removed from the
    set); ``ended``: closed for good (record deleted, id removed from the set).
    """

    session_id: str
    epoch: int
    kind: WriteKind
    ttl_s: float = 0.0
    record: Record = field(default_factory=dict)


class StateStore(ABC):
    kind: str

    async def start(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Connect; raising here only marks state degraded, it never stops the node."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Release connections."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise if the store cannot be reached."""

    @abstractmethod
    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        """Create or refresh a node's record and its session set's TTL; both expire after
        ``ttl_s`` unless refreshed."""

    @abstractmethod
    async def remove_node(self, node_id: str) -> None:
        """Delete a node's record and its session set (clean shutdown). Its sessions stay,
        resumable until their own TTL."""

    @abstractmethod
    async def list_nodes(self) -> list[Record]:
        """Every node record that has not expired."""

    @abstractmethod
    async def write_sessions(
        self,
        node_id: str,
        writes: Sequence[SessionWrite],
        node_ttl_s: float,
        *,
        complete: bool = False,
    ) -> set[str]:
        """Apply ``writes`` for sessions of ``node_id``, all or none.

        A write whose epoch is lower than the stored record's is refused (the record is
        left alone and the id is removed from this node's set). Returns the refused ids:
        sessions a newer connection holds elsewhere.

        ``complete``: the ``live`` writes are every session the node holds, so its set is
        rebuilt from them (a heartbeat repairs whatever a lost or late write left)."""

    @abstractmethod
    async def claim_session(
        self, session_id: str, node_id: str, expected_epoch: int
    ) -> Record | None:
        """Resume: if the stored record still has ``expected_epoch``, atomically raise its
        epoch by one, mark it connected to ``node_id``, drop it from the previous holder's
        set, and return the new record. None when it is gone or someone claimed it first."""

    @abstractmethod
    async def get_session(self, session_id: str) -> Record | None: ...

    @abstractmethod
    async def list_sessions(self) -> list[Record]:
        """Every session record that has not expired, on any node."""

    @abstractmethod
    async def node_sessions(self, node_id: str) -> set[str]:
        """Ids in the node's session set (empty once the node's TTL ran out)."""
