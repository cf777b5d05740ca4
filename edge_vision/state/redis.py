"""Redis state store through ``redis.asyncio``. Key names and TTLs: docs/state.md.

    ev:node:<node_id>            hash   node record                     TTL state.node_ttl_s
    ev:node:<node_id>:sessions   set    ids of sessions the node holds  TTL state.node_ttl_s
    ev:session:<session_id>      hash   session record                  TTL state.session_ttl_s

TTLs are refreshed by every heartbeat while the node lives, so a node killed with
SIGKILL disappears by itself. Writes go through one non-transactional pipeline per flush.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from ..errors import StateUnavailable
from .base import Record, StateStore

P = ParamSpec("P")
R = TypeVar("R")


def _unavailable(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Redis and socket failures become StateUnavailable, the one error the keeper knows."""

    @functools.wraps(fn)
    @_unavailable
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {e}") from e

    return wrapper


PREFIX = "ev:"


def node_key(node_id: str) -> str:
    return f"{PREFIX}node:{node_id}"


def node_sessions_key(node_id: str) -> str:
    return f"{PREFIX}node:{node_id}:sessions"


def session_key(session_id: str) -> str:
    return f"{PREFIX}session:{session_id}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisStore(StateStore):
    kind = "redis"

    def __init__(self, url: str, op_timeout_s: float = 1.0) -> None:
        self.url = url
        self._client: Any = aioredis.from_url(
            url,
            decode_responses=True,
            socket_timeout=op_timeout_s,
            socket_connect_timeout=op_timeout_s,
        )

    async def close(self) -> None:
        await self._client.aclose()

    @_unavailable
    async def ping(self) -> None:
        await self._client.ping()

    @_unavailable
    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        async with self._client.pipeline(transaction=False) as p:
            p.hset(node_key(node_id), mapping=record)
            p.pexpire(node_key(node_id), _ms(ttl_s))
            await p.execute()

    @_unavailable
    async def remove_node(self, node_id: str) -> None:
        await self._client.delete(node_key(node_id), node_sessions_key(node_id))

    @_unavailable
    async def _scan_hashes(self, pattern: str, skip_suffix: str | None = None) -> list[Record]:
        keys = [
            k
            async for k in self._client.scan_iter(match=pattern, count=500)
            if not (skip_suffix and k.endswith(skip_suffix))
        ]
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as p:
            for k in keys:
                p.hgetall(k)
            rows = await p.execute()
        return [r for r in rows if r]

    @_unavailable
    async def list_nodes(self) -> list[Record]:
        return await self._scan_hashes(f"{PREFIX}node:*", skip_suffix=":sessions")

    @_unavailable
    async def write_sessions(
        self, node_id: str, records: list[Record], session_ttl_s: float, node_ttl_s: float
    ) -> None:
        skey = node_sessions_key(node_id)
        async with self._client.pipeline(transaction=False) as p:
            for rec in records:
                k = session_key(rec["id"])
                p.hset(k, mapping=rec)
                p.pexpire(k, _ms(session_ttl_s))
            if records:
                p.sadd(skey, *[r["id"] for r in records])
            p.pexpire(skey, _ms(node_ttl_s))
            await p.execute()

    @_unavailable
    async def release_session(self, node_id: str, record: Record, ttl_s: float) -> None:
        k = session_key(record["id"])
        async with self._client.pipeline(transaction=False) as p:
            p.hset(k, mapping=record)
            p.pexpire(k, _ms(ttl_s))
            p.srem(node_sessions_key(node_id), record["id"])
            await p.execute()

    @_unavailable
    async def end_session(self, node_id: str, session_id: str) -> None:
        async with self._client.pipeline(transaction=False) as p:
            p.delete(session_key(session_id))
            p.srem(node_sessions_key(node_id), session_id)
            await p.execute()

    @_unavailable
    async def get_session(self, session_id: str) -> Record | None:
        rec: Record = await self._client.hgetall(session_key(session_id))
        return rec or None

    @_unavailable
    async def list_sessions(self) -> list[Record]:
        return await self._scan_hashes(f"{PREFIX}session:*")

    @_unavailable
    async def node_sessions(self, node_id: str) -> set[str]:
        members: set[str] = await self._client.smembers(node_sessions_key(node_id))
        return set(members)
