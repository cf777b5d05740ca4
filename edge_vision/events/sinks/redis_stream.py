"""Redis Streams through redis-py: each event one ``XADD`` (fields ``event_id``, ``rule``,
``event``: the JSON), the stream trimmed to about ``maxlen`` entries (``MAXLEN ~``).

A batch is one pipeline (one round trip, the entries in order). Redis answers every XADD
of it or none (MULTI); a batch that failed is sent again whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ...common.redis_client import driver_info_options
from ...config.events import RedisSinkConfig
from ..outbox import Queued
from .base import Sink, SinkError

#: Longest wait for one batch.
TIMEOUT_S = 5.0


class RedisStreamSink(Sink):
    name = "redis"

    def __init__(
        self, cfg: RedisSinkConfig, url: str, password: str | None, tls_ca: Path | None
    ) -> None:
        self.cfg = cfg
        self.url = url
        self._password = password
        self._tls_ca = tls_ca
        self._client: aioredis.Redis | None = None

    def describe(self) -> str:
        where = self.url.split("@")[-1]  # never the password
        return f"redis (stream {self.cfg.stream} on {where}, MAXLEN ~{self.cfg.maxlen})"

    def _connect(self) -> aioredis.Redis:
        extra: dict[str, Any] = driver_info_options()  # no package metadata read per connect
        if self._password is not None:
            extra["password"] = self._password
        if self.url.startswith("rediss://") and self._tls_ca is not None:
            extra["ssl_ca_certs"] = str(self._tls_ca)
        client: aioredis.Redis = aioredis.Redis.from_url(
            self.url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, **extra
        )
        return client

    async def send(self, items: Sequence[Queued]) -> None:
        if self._client is None:
            self._client = self._connect()
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                for i in items:
                    event_id = orjson.loads(i.body).get("event_id", "")
                    pipe.xadd(
                        self.cfg.stream,
                        {"event_id": event_id, "rule": i.rule, "event": i.body},
                        maxlen=self.cfg.maxlen,
                        approximate=True,
                    )
                await pipe.execute()
        except (RedisError, OSError) as e:
            await self.close()
            raise SinkError(f"XADD failed: {e}") from None

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
