"""In-process state store: the embedded default when no Redis is configured.

Same entries, TTL semantics and epoch rule as :class:`~.redis.RedisStore` (expiry is
checked on read), so a single node behaves the same with or without Redis; both pass
the contract tests in ``tests/integration/test_state_store.py``. Nothing here blocks or awaits:
each method runs to completion on the event loop, which is what makes it atomic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .base import Record, SessionWrite, StateStore


class _Entry:
    __slots__ = ("expires", "value")

    def __init__(self, value: Record, expires: float) -> None:
        self.value = value
        self.expires = expires


class MemoryStore(StateStore):
    kind = "memory"

    def __init__(self) -> None:
        self._nodes: dict[str, _Entry] = {}
        self._node_sessions: dict[str, tuple[set[str], float]] = {}
        self._sessions: dict[str, _Entry] = {}

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _session(self, session_id: str) -> _Entry | None:
        entry = self._sessions.get(session_id)
        if entry is not None and entry.expires <= self._now():
            del self._sessions[session_id]
            return None
        return entry

    def _held(self, node_id: str) -> set[str]:
        """The node's live set, created without an expiry until write_node/write_sessions
        give it one (as Redis's SADD does)."""
        ids, expires = self._node_sessions.get(node_id, (set(), float("inf")))
        if expires <= self._now():
            ids, expires = set(), float("inf")
        self._node_sessions[node_id] = (ids, expires)
        return ids

    def _expire_set(self, node_id: str, ttl_s: float) -> None:
        entry = self._node_sessions.get(node_id)
        if entry is not None and entry[1] > self._now():
            self._node_sessions[node_id] = (entry[0], self._now() + ttl_s)

    async def ping(self) -> None:
        return None

    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        self._nodes[node_id] = _Entry(dict(record), self._now() + ttl_s)
        self._expire_set(node_id, ttl_s)

    async def remove_node(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._node_sessions.pop(node_id, None)

    async def list_nodes(self) -> list[Record]:
        now = self._now()
        self._nodes = {k: e for k, e in self._nodes.items() if e.expires > now}
        return [dict(e.value) for e in self._nodes.values()]

    async def write_sessions(
        self,
        node_id: str,
        writes: Sequence[SessionWrite],
        node_ttl_s: float,
        *,
        complete: bool = False,
    ) -> set[str]:
        refused: set[str] = set()
        held = self._held(node_id)
        if complete:
            held.clear()
        now = self._now()
        for w in writes:
            entry = self._session(w.session_id)
            if entry is not None and int(entry.value.get("epoch", "0")) > w.epoch:
                refused.add(w.session_id)
                held.discard(w.session_id)
                continue
            if w.kind == "ended":
                self._sessions.pop(w.session_id, None)
                held.discard(w.session_id)
                continue
            self._sessions[w.session_id] = _Entry(dict(w.record), now + w.ttl_s)
            if w.kind == "live":
                held.add(w.session_id)
            else:
                held.discard(w.session_id)
        self._expire_set(node_id, node_ttl_s)
        return refused

    async def claim_session(
        self, session_id: str, node_id: str, expected_epoch: int
    ) -> Record | None:
        entry = self._session(session_id)
        if entry is None or entry.value.get("epoch") != str(expected_epoch):
            return None
        previous = entry.value.get("node", "")
        entry.value.update(epoch=str(expected_epoch + 1), node=node_id, connected="1")
        prev_set = self._node_sessions.get(previous)
        if prev_set is not None:
            prev_set[0].discard(session_id)
        return dict(entry.value)

    async def get_session(self, session_id: str) -> Record | None:
        entry = self._session(session_id)
        return dict(entry.value) if entry is not None else None

    async def list_sessions(self) -> list[Record]:
        now = self._now()
        self._sessions = {k: e for k, e in self._sessions.items() if e.expires > now}
        return [dict(e.value) for e in self._sessions.values()]

    async def node_sessions(self, node_id: str) -> set[str]:
        entry = self._node_sessions.get(node_id)
        if entry is None or entry[1] <= self._now():
            return set()
        return set(entry[0])
