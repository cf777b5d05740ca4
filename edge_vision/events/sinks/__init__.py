"""Where events go besides the session's WebSocket: MQTT, Redis Streams, webhooks.

Each sink is one small class behind :class:`Sink`: it connects, and it delivers a batch of
events (their JSON, oldest first) in order, saying how many the far end took. The hub
(:mod:`edge_vision.events.hub`) owns the rest: the outbox each sink reads, retries with
backoff, the metrics. :func:`build_sinks` makes the sinks the config names.
"""

from __future__ import annotations

from ...config import EventsConfig, StateConfig
from ...errors import ConfigError
from .base import Sink, SinkError
from .redis_stream import RedisStreamSink
from .webhook import WebhookSink

__all__ = ["Sink", "SinkError", "build_sinks"]


def build_sinks(events: EventsConfig, state: StateConfig, client_id: str) -> list[Sink]:
    """The sinks ``events.sinks`` names (the Redis one defaults to ``state.redis_url``)."""
    out: list[Sink] = []
    s = events.sinks
    if s.mqtt.url is not None:
        try:  # an optional dependency (the events extra): only where MQTT is configured
            from .mqtt import MqttSink
        except ImportError as e:
            raise ConfigError(
                f"events.sinks.mqtt.url is set but its client cannot load ({e}): "
                "pip install 'edge-vision[events]'"
            ) from None
        out.append(MqttSink(s.mqtt, client_id))
    redis_url = s.redis.url or state.redis_url
    if s.redis.enabled and redis_url is not None:
        password = None if s.redis.url else state.redis_password
        ca = None if s.redis.url else state.redis_tls_ca
        out.append(RedisStreamSink(s.redis, redis_url, password, ca))
    if s.webhook.url is not None:
        out.append(WebhookSink(s.webhook))
    return out
