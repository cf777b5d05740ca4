"""The ``events`` section: zones, lines, rules and where events go (docs/events.md).

The shapes a user writes, validated here; what they mean is :mod:`edge_vision.events`.
A session may add zones, lines and rules of its own through its ``settings`` message
(:class:`SessionEventsSettings`: the same shapes, smaller caps); the node's apply to every
session.
"""

from __future__ import annotations

import re
from collections.abc import Set
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from .base import _Section

#: Names of zones, lines and rules: they become MQTT topic levels and Redis fields, so no
#: ``/``, ``+``, ``#`` or spaces.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
_NAME = re.compile(NAME_PATTERN)
#: A rule's ``text`` expression: longer ones are refused (they run on every read box).
MAX_TEXT_PATTERN = 256
#: Caps on one session's own zones, lines and rules (``settings``), and on a polygon.
MAX_SESSION_ZONES = 16
MAX_SESSION_LINES = 16
MAX_SESSION_RULES = 16
MAX_POLYGON_POINTS = 64

On = Literal["appear", "leave", "cross", "dwell", "every"]
Direction = Literal["any", "forward", "backward"]
Anchor = Literal["bottom_center", "center"]
Point = tuple[float, float]


def _point(value: Any, where: str) -> Point:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{where}: a point is [x, y], got {value!r}")
    x, y = float(value[0]), float(value[1])
    if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise ValueError(f"{where}: points are fractions of the frame, 0..1; got [{x}, {y}]")
    return x, y


def _named(values: Any, what: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ValueError(f"{what} must be a mapping of name to points")
    for name in values:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{what} name {name!r}: 1-64 letters, digits, '_', '.' or '-' (it becomes "
                "an MQTT topic level)"
            )
    return values


def check_zones(values: Any) -> dict[str, tuple[Point, ...]]:
    """``{name: [[x, y], ...]}``: polygons of 3 to 64 points in 0..1 frame fractions."""
    out = {}
    for name, points in _named(values, "zone").items():
        if not isinstance(points, list | tuple) or not 3 <= len(points) <= MAX_POLYGON_POINTS:
            raise ValueError(f"zone {name!r}: a polygon of 3 to {MAX_POLYGON_POINTS} points")
        out[name] = tuple(_point(p, f"zone {name!r}") for p in points)
    return out


def check_lines(values: Any) -> dict[str, tuple[Point, Point]]:
    """``{name: [[x1, y1], [x2, y2]]}``: two distinct points in 0..1 frame fractions."""
    out = {}
    for name, points in _named(values, "line").items():
        if not isinstance(points, list | tuple) or len(points) != 2:
            raise ValueError(f"line {name!r}: two points, [[x1, y1], [x2, y2]]")
        a, b = (_point(p, f"line {name!r}") for p in points)
        if a == b:
            raise ValueError(f"line {name!r}: its two points are the same")
        out[name] = (a, b)
    return out


class RuleConfig(_Section):
    """One rule: which detections it is about (``class``, ``text``, ``zone``,
    ``min_score``) and what raises an event (``on``)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True
    )

    name: str = Field(
        pattern=NAME_PATTERN,
        description="The rule's name, unique: events carry it, and MQTT publishes them to "
        "a topic of that name under events.sinks.mqtt.topic.",
    )
    on: On = Field(
        description="appear: a track first matches (once per track); leave: a track that "
        "matched is gone past the tracker's keep time (or the session ended); cross: its "
        "anchor crosses 'line'; dwell: it matched for 'seconds' on end; every: each "
        "matching frame, at most once per track per 'interval_s'.",
    )
    class_: list[str | int] | None = Field(
        None,
        alias="class",
        description="Class names (the model's labels) or indices the rule is about; null: any.",
    )
    text: str | None = Field(
        None,
        description="A regular expression searched for in the text read in the box "
        "(Python re; anchor it with ^ and $ for the whole text). A rule with text turns "
        "reading on for the boxes it could match.",
    )
    zone: str | None = Field(
        None, description="A zone's name: the detection's anchor must lie in it."
    )
    min_score: float = Field(0.0, ge=0, le=1, description="Lowest detection score matched.")
    line: str | None = Field(None, description="on: cross: the line's name.")
    direction: Direction = Field(
        "any",
        description="on: cross: forward (from the line's left to its right, walking from "
        "its first point to its second on the picture: downwards for a line drawn left "
        "to right), backward, or any.",
    )
    seconds: float | None = Field(None, gt=0, description="on: dwell: how long, in seconds.")
    interval_s: float = Field(
        1.0, ge=0, description="on: every: shortest time between two events of one track."
    )
    crop: bool = Field(
        False,
        description="Send a JPEG of the box with each event to the sinks (events.crop_max_bytes "
        "at most; never on the WebSocket, whose client has the frame).",
    )

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare ``on`` key as the boolean true: take it as "on".
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("class_", mode="before")
    @classmethod
    def _one_class(cls, value: Any) -> Any:
        return [value] if isinstance(value, str | int) and not isinstance(value, bool) else value

    @field_validator("text")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if len(value) > MAX_TEXT_PATTERN:
            raise ValueError(f"'text' is longer than {MAX_TEXT_PATTERN} characters")
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"'text' is not a regular expression: {e}") from None
        return value

    @model_validator(mode="after")
    def _kind_needs(self) -> RuleConfig:
        if self.on == "cross" and self.line is None:
            raise ValueError(f"rule {self.name!r}: on: cross needs 'line'")
        if self.on != "cross" and (self.line is not None or self.direction != "any"):
            raise ValueError(f"rule {self.name!r}: 'line' and 'direction' are for on: cross")
        if self.on == "dwell" and self.seconds is None:
            raise ValueError(f"rule {self.name!r}: on: dwell needs 'seconds'")
        if self.on != "dwell" and self.seconds is not None:
            raise ValueError(f"rule {self.name!r}: 'seconds' is for on: dwell")
        return self


def check_rules(
    rules: list[RuleConfig], zones: Set[str], lines: Set[str], taken: Set[str] = frozenset()
) -> None:
    """Names unique (and not among ``taken``: the node's, for a session's own rules),
    every zone and line named exists."""
    seen = set(taken)
    for rule in rules:
        if rule.name in seen:
            raise ValueError(f"rule name {rule.name!r} is used twice")
        seen.add(rule.name)
        if rule.zone is not None and rule.zone not in zones:
            raise ValueError(f"rule {rule.name!r}: no zone named {rule.zone!r}")
        if rule.line is not None and rule.line not in lines:
            raise ValueError(f"rule {rule.name!r}: no line named {rule.line!r}")


class MqttSinkConfig(_Section):
    """MQTT 3.1.1 or 5 (aiomqtt): one message per event, QoS 1, to ``TOPIC/RULE``."""

    url: str | None = Field(
        None,
        pattern=r"^mqtts?://",
        description="mqtt://host:port, or mqtts://host:port for TLS; null: no MQTT sink.",
    )
    topic: str = Field(
        "edge-vision/events",
        pattern=r"^[^#+]{1,200}$",
        description="Topic prefix: an event of rule R goes to this topic, then /R.",
    )
    username: str | None = Field(None, description="MQTT user name.")
    password: SecretStr | None = Field(
        None,
        description="MQTT password (set it through EDGE_VISION_EVENTS__SINKS__MQTT__PASSWORD).",
    )
    protocol: Literal["3.1.1", "5"] = Field("5", description="MQTT protocol version.")
    tls_ca: Path | None = Field(None, description="CA bundle of the broker's certificate.")
    client_id: str | None = Field(
        None, description="MQTT client id; default edge-vision-NODE-N (the node id, the worker)."
    )


class RedisSinkConfig(_Section):
    """Redis Streams: one ``XADD`` per event, trimmed to about ``maxlen`` entries."""

    url: str | None = Field(
        None,
        pattern=r"^(redis|rediss|unix)://",
        description="Redis to add events to; null: state.redis_url when set (with "
        "state.redis_password), else no Redis sink. Set enabled: false to have none.",
    )
    enabled: bool = Field(
        True, description="false: no Redis sink even where state.redis_url is set."
    )
    stream: str = Field("edge-vision:events", description="The stream's key.")
    maxlen: int = Field(
        100_000, ge=1, description="Entries the stream keeps (approximately: MAXLEN ~)."
    )


class WebhookSinkConfig(_Section):
    """HTTP POST of each event as JSON, signed with HMAC-SHA256."""

    url: str | None = Field(
        None, pattern=r"^https?://", description="Where to POST events; null: no webhook."
    )
    secret: SecretStr | None = Field(
        None,
        description="HMAC-SHA256 key: the X-Edge-Vision-Signature header is "
        "sha256=HEX, the hex digest of the HMAC of the body (set it through "
        "EDGE_VISION_EVENTS__SINKS__WEBHOOK__SECRET).",
    )
    timeout_s: float = Field(5.0, gt=0, description="Longest wait for one POST's answer.")


class SinksConfig(_Section):
    """Where events go besides the session's own WebSocket; each is optional."""

    mqtt: MqttSinkConfig = Field(default_factory=MqttSinkConfig)
    redis: RedisSinkConfig = Field(default_factory=RedisSinkConfig)
    webhook: WebhookSinkConfig = Field(default_factory=WebhookSinkConfig)


class EventsConfig(_Section):
    """Zones, lines and rules every session of the node has, and the sinks (docs/events.md)."""

    zones: dict[str, tuple[Point, ...]] = Field(
        default_factory=dict,
        description="Named polygons in fractions of the frame (0..1, x right, y down): "
        "{name: [[x, y], ...]}, 3 to 64 points.",
    )
    lines: dict[str, tuple[Point, Point]] = Field(
        default_factory=dict,
        description="Named lines for on: cross, in fractions of the frame: "
        "{name: [[x1, y1], [x2, y2]]}.",
    )
    rules: list[RuleConfig] = Field(
        default_factory=list, description="The rules every session of this node runs."
    )
    anchor: Anchor = Field(
        "bottom_center",
        description="A detection's point for zones and lines: its box's bottom centre "
        "(where an object stands) or centre.",
    )
    crop_max_bytes: int = Field(
        65_536, ge=1024, description="Largest JPEG crop an event carries (rule crop: true)."
    )
    session_rules: bool = Field(
        True, description="Sessions may add zones, lines and rules of their own (settings)."
    )
    session_rules_to_sinks: bool = Field(
        False,
        description="Events of a session's own rules go to the sinks too, not only to its "
        "WebSocket (off: a client cannot publish to the plant's topics).",
    )
    outbox_dir: Path | None = Field(
        None,
        description="Folder of the sinks' outboxes (SQLite, one file per worker): events "
        "a sink has not taken survive a restart. null: held in memory only.",
    )
    outbox_max: int = Field(
        100_000,
        ge=1,
        description="Events one sink's outbox holds while the sink is down; beyond it the "
        "oldest are dropped and counted (edge_vision_events_dropped_total).",
    )
    sinks: SinksConfig = Field(default_factory=SinksConfig)

    @field_validator("zones", mode="before")
    @classmethod
    def _zones(cls, value: Any) -> Any:
        return check_zones(value)

    @field_validator("lines", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        return check_lines(value)

    @model_validator(mode="after")
    def _names(self) -> EventsConfig:
        check_rules(self.rules, set(self.zones), set(self.lines))
        return self

    def announced(self) -> dict[str, Any]:
        """The node's zones and lines and its anchor, as hello's ``events`` announces them
        to a protocol 3 client (docs/protocol.md): a page draws them over the picture."""
        return {
            "zones": {name: [list(p) for p in points] for name, points in self.zones.items()},
            "lines": {name: [list(p) for p in points] for name, points in self.lines.items()},
            "anchor": self.anchor,
        }


class SessionEventsSettings(_Section):
    """A session's own zones, lines and rules, from its ``settings`` message."""

    zones: dict[str, tuple[Point, ...]] = Field(default_factory=dict)
    lines: dict[str, tuple[Point, Point]] = Field(default_factory=dict)
    rules: list[RuleConfig] = Field(default_factory=list, max_length=MAX_SESSION_RULES)

    @field_validator("zones", mode="before")
    @classmethod
    def _zones(cls, value: Any) -> Any:
        if isinstance(value, dict) and len(value) > MAX_SESSION_ZONES:
            raise ValueError(f"at most {MAX_SESSION_ZONES} zones of a session's own")
        return check_zones(value)

    @field_validator("lines", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        if isinstance(value, dict) and len(value) > MAX_SESSION_LINES:
            raise ValueError(f"at most {MAX_SESSION_LINES} lines of a session's own")
        return check_lines(value)

    def public(self) -> dict[str, Any]:
        """As the ``settings`` answer and the session record carry it (plain JSON)."""
        return {
            "zones": {k: [list(p) for p in v] for k, v in self.zones.items()},
            "lines": {k: [list(p) for p in v] for k, v in self.lines.items()},
            "rules": [r.model_dump(mode="json", exclude_defaults=True) for r in self.rules],
        }
