"""Sections of the session and its shared state: ``session`` and ``state``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from ..common.settings import Mode
from .base import _Section


class SessionConfig(_Section):
    default_mode: Mode = Field("latest", description="latest: newest frame wins; every: all.")
    every_queue: int = Field(
        8, ge=1, description="Frames waiting per 'every' connection before reads pause."
    )
    every_in_flight: int = Field(
        2, ge=1, description="Frames of one 'every' connection processed at once (in order)."
    )
    latest_in_flight: int = Field(
        3,
        ge=2,
        le=16,
        description="Most frames of one 'latest' connection between its waiting slot and its "
        "reply (decoding, waiting for the engine, inferring, sending). One is decoded at a "
        "time and the newest decoded frame takes the place of one still waiting for the "
        "engine, so this only bounds work, never latency.",
    )
    max_messages_per_s: float = Field(
        120.0,
        ge=0,
        description="Read budget of one connection: messages read per second, up to "
        "message_burst at once: frames in latest mode, settings, pings and bad messages (a "
        "frame admitted in every mode is paced by that queue's back-pressure instead). Over "
        "it the server stops reading that socket (TCP back-pressure) until the budget "
        "refills, so a flooding client costs what a 120 fps camera costs; in latest mode the "
        "frames it reads are replaced by newer ones and counted as dropped. 0: no budget.",
    )
    message_burst: int = Field(
        60,
        ge=1,
        description="Messages one connection may send at once above max_messages_per_s "
        "before its reading pauses (the token bucket's size).",
    )


class StateConfig(_Section):
    """Shared connection state (docs/state.md): where it lives, key TTLs, heartbeat."""

    redis_url: str | None = Field(
        None,
        pattern=r"^(redis|rediss|unix)://",
        description="redis://[[user]:password@]host:port/db, rediss:// (TLS) or "
        "unix:///path/redis.sock?db=0; none keeps state in this process.",
    )
    redis_password: str | None = Field(
        None, description="Redis password (AUTH); overrides one given in the URL."
    )
    redis_tls_ca: Path | None = Field(
        None, description="CA bundle that signed the Redis server's certificate (rediss://)."
    )
    redis_tls_cert: Path | None = Field(
        None, description="Client certificate, when Redis asks for one (tls-auth-clients)."
    )
    redis_tls_key: Path | None = Field(None, description="Private key of redis_tls_cert.")
    key_prefix: str = Field(
        "ev:",
        pattern=r"^[A-Za-z0-9._:-]{0,32}$",
        description="Prefix of every key, so several services can share one Redis.",
    )
    node_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="This node's id (letters, digits, . _ -); default host-pid.",
    )
    advertise_url: str | None = Field(None, description="Address other nodes see for this node.")
    node_ttl_s: float = Field(
        15.0,
        gt=0,
        description="Node key TTL, refreshed by heartbeat; a dead node vanishes "
        "after this long. Must exceed heartbeat_s.",
    )
    session_ttl_s: float = Field(
        120.0, gt=0, description="How long a disconnected session can be resumed."
    )
    heartbeat_s: float = Field(
        5.0,
        gt=0,
        description="Heartbeat and state flush period; while Redis is unreachable, "
        "writes are retried at least this often (and at least every 2 s).",
    )
    op_timeout_s: float = Field(1.0, gt=0, description="Deadline for one Redis operation.")

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> StateConfig:
        if self.node_ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"state.node_ttl_s ({self.node_ttl_s}) must be longer than state.heartbeat_s "
                f"({self.heartbeat_s}), or live nodes would expire between heartbeats"
            )
        return self
