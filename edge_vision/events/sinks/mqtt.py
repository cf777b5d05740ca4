"""MQTT (3.1.1 or 5) through aiomqtt: each event one message, QoS 1, to ``TOPIC/RULE``.

QoS 1: the broker acknowledges each message (PUBACK), and an event counts as taken only
then. The messages of one batch are published together and acknowledged in order; when
the broker goes away the client is dropped and the next delivery connects again.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

import aiomqtt

from ...config.events import MqttSinkConfig
from ..outbox import Queued
from .base import Sink, SinkError

log = logging.getLogger(__name__)

#: Longest wait for the broker to answer a connect or acknowledge a batch.
TIMEOUT_S = 10.0


class MqttSink(Sink):
    name = "mqtt"

    def __init__(self, cfg: MqttSinkConfig, client_id: str) -> None:
        if cfg.url is None:
            raise ValueError("the MQTT sink needs events.sinks.mqtt.url")
        url = urlsplit(cfg.url)
        self.cfg = cfg
        self.tls = url.scheme == "mqtts"
        self.host = url.hostname or "localhost"
        self.port = url.port or (8883 if self.tls else 1883)
        self.username = cfg.username or url.username
        password = cfg.password.get_secret_value() if cfg.password else url.password
        self._password = password
        self.client_id = cfg.client_id or client_id
        self.topic = cfg.topic.rstrip("/")
        self._client: aiomqtt.Client | None = None

    def describe(self) -> str:
        scheme = "mqtts" if self.tls else "mqtt"
        return f"mqtt ({scheme}://{self.host}:{self.port}, topic {self.topic}/RULE, QoS 1)"

    async def _connect(self) -> aiomqtt.Client:
        tls_context = None
        if self.tls:  # reads the CA files: off the loop
            ca = str(self.cfg.tls_ca) if self.cfg.tls_ca else None
            tls_context = await asyncio.to_thread(ssl.create_default_context, cafile=ca)
        protocol = (
            aiomqtt.ProtocolVersion.V5 if self.cfg.protocol == "5" else aiomqtt.ProtocolVersion.V311
        )
        client = aiomqtt.Client(
            self.host,
            self.port,
            username=self.username,
            password=self._password,
            identifier=self.client_id,
            protocol=protocol,
            tls_context=tls_context,
            timeout=TIMEOUT_S,
            logger=log,
        )
        await client.__aenter__()
        return client

    async def send(self, items: Sequence[Queued]) -> None:
        try:
            if self._client is None:
                self._client = await self._connect()
        except (aiomqtt.MqttError, OSError) as e:
            raise SinkError(f"cannot connect to {self.host}:{self.port}: {e}") from None
        client = self._client
        results = await asyncio.gather(
            *(
                client.publish(f"{self.topic}/{i.rule}", i.body, qos=1, timeout=TIMEOUT_S)
                for i in items
            ),
            return_exceptions=True,
        )
        for taken, r in enumerate(results):
            if isinstance(r, BaseException):
                if isinstance(r, asyncio.CancelledError):
                    raise r
                await self._drop_client()
                raise SinkError(f"publish failed: {r}", taken)

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.__aexit__(None, None, None)
            except (aiomqtt.MqttError, OSError):
                pass

    async def close(self) -> None:
        await self._drop_client()
