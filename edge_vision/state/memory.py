"""In-process state store: the embedded default when no Redis is configured.

It keeps the same keys and TTL semantics as the Redis store (expiry is checked on read),
so a single node behaves the same with or without Redis.
"""

from __future__ import annotations

import time

from .base import Record, StateStore


class MemoryStore(StateStore):
    kind = "memory"

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Record, float]] = {}
        self._node_sessions: dict[str, tuple[set[str], float]] = {}
        self._sessions: dict[str, tuple[Record, float]] = {}

    @staticmethod
    def _alive(expires: float) -> bool:
        return expires > time.monotonic()

    async def ping(self) -> None:
        return None

    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        self._nodes[node_id] = (dict(record), time.monotonic() + ttl_s)

    async def remove_node(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._node_sessions.pop(node_id, None)

    async def list_nodes(self) -> list[Record]:
        self._nodes = {k: v for k, v in self._nodes.items() if self._alive(v[1])}
        return [dict(r) for r, _ in self._nodes.values()]

    async def write_sessions(
        self, node_id: str, records: list[Record], session_ttl_s: float, node_ttl_s: float
    ) -> None:
        now = time.monotonic()
        ids, expires = self._node_sessions.get(node_id, (set(), 0.0))
        if not self._alive(expires):
            ids = set()
        for rec in records:
            self._sessions[rec["id"]] = (dict(rec), now + session_ttl_s)
            ids.add(rec["id"])
        self._node_sessions[node_id] = (ids, now + node_ttl_s)

    async def release_session(self, node_id: str, record: Record, ttl_s: float) -> None:
        self._sessions[record["id"]] = (dict(record), time.monotonic() + ttl_s)
        self._discard(node_id, record["id"])

    async def end_session(self, node_id: str, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._discard(node_id, session_id)

    def _discard(self, node_id: str, session_id: str) -> None:
        entry = self._node_sessions.get(node_id)
        if entry is not None:
            entry[0].discard(session_id)

    async def get_session(self, session_id: str) -> Record | None:
        entry = self._sessions.get(session_id)
        if entry is None or not self._alive(entry[1]):
            self._sessions.pop(session_id, None)
            return None
        return dict(entry[0])

    async def list_sessions(self) -> list[Record]:
        self._sessions = {k: v for k, v in self._sessions.items() if self._alive(v[1])}
        return [dict(r) for r, _ in self._sessions.values()]

    async def node_sessions(self, node_id: str) -> set[str]:
        entry = self._node_sessions.get(node_id)
        if entry is None or not self._alive(entry[1]):
            return set()
        return set(entry[0])
