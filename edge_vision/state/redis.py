"""Redis state store through ``redis.asyncio``. Key names and TTLs: docs/state.md.

    <prefix>node:<node_id>            hash   node record                     TTL state.node_ttl_s
    <prefix>node:<node_id>:sessions   set    ids of sessions the node holds  TTL state.node_ttl_s
    <prefix>session:<session_id>      hash   session record                  TTL state.session_ttl_s

``<prefix>`` is ``state.key_prefix`` (``ev:``). TTLs are refreshed by every heartbeat while
the node lives, so a node killed with SIGKILL disappears by itself. Each session write is
one Lua script (EVALSHA), so the epoch check and the write are atomic
(https://redis.io/docs/latest/develop/interact/programmability/eval-intro/); one flush is
one MULTI/EXEC pipeline of such calls, one round trip.

The URL may be ``redis://[[user]:password@]host:port/db``, ``rediss://`` (TLS) or
``unix:///path/to/redis.sock?db=0``; ``state.redis_password`` and the ``state.redis_tls_*``
files complete it (redis-py ``from_url``: https://redis.readthedocs.io/en/stable/connections.html).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..common.redis_client import driver_info_options as driver_info_options
from ..config import StateConfig
from ..errors import StateUnavailable
from .base import Record, SessionWrite, StateStore

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_PREFIX = "ev:"

# KEYS: session key, node's session set.
# ARGV: session id, epoch, kind (live|released|ended), session ttl ms, node ttl ms,
#       then the record as field, value, ...
# Returns 1 when applied, 0 when refused because a newer epoch holds the session.
_WRITE_SESSION = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if stored > tonumber(ARGV[2]) then
  redis.call('SREM', KEYS[2], ARGV[1])
  return 0
end
if ARGV[3] == 'ended' then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[1])
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[3] == 'live' then
  redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
else
  redis.call('SREM', KEYS[2], ARGV[1])
end
return 1
"""

# KEYS: session key, the previous holder's session set.
# ARGV: session id, expected epoch, claiming node id.
# Returns the new record as a flat field/value list, or nil when the epoch moved on.
_CLAIM_SESSION = """
local stored = redis.call('HGET', KEYS[1], 'epoch')
if not stored or stored ~= ARGV[2] then
  return false
end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'node', ARGV[3], 'connected', '1')
redis.call('SREM', KEYS[2], ARGV[1])
return redis.call('HGETALL', KEYS[1])
"""


def _unavailable(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Redis and socket failures become StateUnavailable, the one error the keeper knows."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {e or type(e).__name__}") from e

    return wrapper


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisStore(StateStore):
    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        op_timeout_s: float = 1.0,
        prefix: str = DEFAULT_PREFIX,
        password: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": op_timeout_s,
            "socket_connect_timeout": op_timeout_s,
            # One immediate reconnect: after a Redis restart every pooled connection is
            # dead and the first command on each fails. More retries (redis-py's default
            # is ten, with backoff) would only hold the keeper's flush past its deadline;
            # the keeper has its own backoff.
            "retry": Retry(NoBackoff(), 1),
        }
        options.update(driver_info_options())
        if password is not None:
            options["password"] = password
        if tls_ca is not None:
            options["ssl_ca_certs"] = tls_ca
        if tls_cert is not None:
            options["ssl_certfile"] = tls_cert
        if tls_key is not None:
            options["ssl_keyfile"] = tls_key
        self._client: Any = aioredis.from_url(url, **options)
        self._write_script: Any = self._client.register_script(_WRITE_SESSION)
        self._claim_script: Any = self._client.register_script(_CLAIM_SESSION)

    @classmethod
    def from_config(cls, cfg: StateConfig) -> RedisStore:
        if not cfg.redis_url:
            raise RuntimeError("RedisStore needs state.redis_url")
        return cls(
            cfg.redis_url,
            op_timeout_s=cfg.op_timeout_s,
            prefix=cfg.key_prefix,
            password=cfg.redis_password,
            tls_ca=str(cfg.redis_tls_ca) if cfg.redis_tls_ca else None,
            tls_cert=str(cfg.redis_tls_cert) if cfg.redis_tls_cert else None,
            tls_key=str(cfg.redis_tls_key) if cfg.redis_tls_key else None,
        )

    # -- key names (docs/state.md) ------------------------------------------------------

    def node_key(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}"

    def node_sessions_key(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}:sessions"

    def session_key(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}"

    # -- StateStore ---------------------------------------------------------------------

    async def close(self) -> None:
        await self._client.aclose()

    @_unavailable
    async def ping(self) -> None:
        await self._client.ping()

    @_unavailable
    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        key = self.node_key(node_id)
        async with self._client.pipeline(transaction=True) as p:
            p.delete(key)  # fields a newer version no longer writes must not linger
            p.hset(key, mapping=record)
            p.pexpire(key, _ms(ttl_s))
            p.pexpire(self.node_sessions_key(node_id), _ms(ttl_s))
            await p.execute()

    @_unavailable
    async def remove_node(self, node_id: str) -> None:
        await self._client.delete(self.node_key(node_id), self.node_sessions_key(node_id))

    async def _hashes(self, pattern: str, keep: Callable[[str], bool]) -> list[Record]:
        # SCAN, not KEYS: it never blocks Redis for long, whatever the key count. Only the
        # admin API lists, so a walk over the key space is affordable there.
        keys = [k async for k in self._client.scan_iter(match=pattern, count=500) if keep(k)]
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as p:
            for k in keys:
                p.hgetall(k)
            rows: list[Record] = await p.execute()
        return [r for r in rows if r]  # a key may expire between SCAN and HGETALL

    @_unavailable
    async def list_nodes(self) -> list[Record]:
        start = len(self.node_key(""))
        # The pattern also matches the <prefix>node:<id>:sessions sets; ids have no ':'.
        return await self._hashes(self.node_key("*"), lambda k: ":" not in k[start:])

    @_unavailable
    async def write_sessions(
        self,
        node_id: str,
        writes: Sequence[SessionWrite],
        node_ttl_s: float,
        *,
        complete: bool = False,
    ) -> set[str]:
        set_key = self.node_sessions_key(node_id)
        # MULTI/EXEC: a flush cut off half-way (connection lost) applies nothing, and
        # nobody reads the node's set while it is being rebuilt.
        async with self._client.pipeline(transaction=True) as p:
            if complete:
                p.delete(set_key)
            for w in writes:
                flat: list[str] = []
                for k, v in w.record.items():
                    flat += (k, v)
                args = [w.session_id, str(w.epoch), w.kind, _ms(w.ttl_s), _ms(node_ttl_s), *flat]
                await self._write_script(
                    keys=[self.session_key(w.session_id), set_key], args=args, client=p
                )
            p.pexpire(set_key, _ms(node_ttl_s))
            results = await p.execute()
        applied = results[1:] if complete else results
        return {w.session_id for w, ok in zip(writes, applied, strict=False) if not ok}

    @_unavailable
    async def claim_session(
        self, session_id: str, node_id: str, expected_epoch: int
    ) -> Record | None:
        key = self.session_key(session_id)
        previous = await self._client.hget(key, "node")
        if previous is None:
            return None
        flat: list[str] | None = await self._claim_script(
            keys=[key, self.node_sessions_key(previous)],
            args=[session_id, str(expected_epoch), node_id],
        )
        if not flat:
            return None
        return dict(zip(flat[::2], flat[1::2], strict=True))

    @_unavailable
    async def get_session(self, session_id: str) -> Record | None:
        rec: Record = await self._client.hgetall(self.session_key(session_id))
        return rec or None

    @_unavailable
    async def list_sessions(self) -> list[Record]:
        return await self._hashes(self.session_key("*"), lambda k: True)

    @_unavailable
    async def node_sessions(self, node_id: str) -> set[str]:
        members: set[str] = await self._client.smembers(self.node_sessions_key(node_id))
        return set(members)
