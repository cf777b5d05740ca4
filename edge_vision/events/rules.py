"""Rules: which detections a rule is about, and when it raises an event. Pure, no I/O.

A rule (:class:`Rule`, compiled from the config's or a session's
:class:`~edge_vision.config.RuleConfig`) has filters — ``class`` (labels or indices),
``text`` (a regular expression searched for in the text read in the box), ``zone`` (the
detection's anchor lies in it) and ``min_score`` — and a kind, ``on``. A detection that
passes every filter *matches*. Each kind is a function of one track's history: the
:class:`Observation` of the track in each answered frame, in frame order, and the
:class:`RuleState` the rule keeps for that track:

* ``appear``: the first observation that matches; once per track;
* ``leave``: the track ended (the tracker forgot it: gone past its keep time, or the
  session ended) after it matched at least once; once per track, carrying its last
  matching observation;
* ``cross``: the track's anchor moved across the rule's line between two observations
  (in the rule's ``direction``, or either), and the observation after the crossing
  matches; every crossing;
* ``dwell``: the track matched in every observation for ``seconds`` (a frame that missed
  the track does not break the stretch; one where it does not match does); once per
  stretch;
* ``every``: each matching observation, at most one per ``interval_s`` per track.

:func:`step` advances a rule over one observation, :func:`end` over a track's end, and
:func:`replay_history` folds a whole history: the unit tests feed it literal histories
(tests/unit/test_rules.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.messages import FrameId
from ..config import RuleConfig
from .geometry import Direction, Line, Point, Zone


@dataclass(frozen=True, slots=True)
class Observation:
    """One track in one answered frame."""

    track: int
    t: float  # the server's clock when the frame arrived, Unix seconds
    frame_id: FrameId | None
    ts: float | int | None  # the frame's own timestamp, as the client sent it
    box: tuple[float, float, float, float]  # frame pixels
    score: float
    cls: int
    label: str
    anchor: Point  # fractions of the frame
    zones: tuple[str, ...] = ()  # the zones the anchor lies in, by name
    text: str | None = None  # read in the box; None: not read (yet)

    def to_json(self) -> list[Any]:
        """Compact plain values, for the session record (:meth:`from_json`)."""
        return [
            self.track,
            self.t,
            self.frame_id,
            self.ts,
            list(self.box),
            self.score,
            self.cls,
            self.label,
            list(self.anchor),
            list(self.zones),
            self.text,
        ]

    @classmethod
    def from_json(cls, v: Any) -> Observation:
        track, t, frame_id, ts, box, score, cls_, label, anchor, zones, text = v
        x1, y1, x2, y2 = (float(b) for b in box)
        return cls(
            int(track),
            float(t),
            frame_id,
            ts,
            (x1, y1, x2, y2),
            float(score),
            int(cls_),
            str(label),
            (float(anchor[0]), float(anchor[1])),
            tuple(str(z) for z in zones),
            None if text is None else str(text),
        )


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule ready to run: its filters compiled, its zone and line resolved."""

    name: str
    on: str
    classes: frozenset[int] | None = None  # with ``labels``: None for any class
    labels: frozenset[str] = frozenset()
    text: re.Pattern[str] | None = None
    zone: str | None = None
    min_score: float = 0.0
    line: Line | None = None
    direction: str = "any"
    seconds: float = 0.0
    interval_s: float = 0.0
    crop: bool = False
    own: bool = False  # a session's own rule (settings), not the node's

    @classmethod
    def from_config(cls, cfg: RuleConfig, lines: Mapping[str, Line], *, own: bool = False) -> Rule:
        classes = labels = None
        if cfg.class_ is not None:
            classes = frozenset(c for c in cfg.class_ if isinstance(c, int))
            labels = frozenset(c for c in cfg.class_ if isinstance(c, str))
        return cls(
            name=cfg.name,
            on=cfg.on,
            classes=classes,
            labels=labels or frozenset(),
            text=re.compile(cfg.text) if cfg.text is not None else None,
            zone=cfg.zone,
            min_score=cfg.min_score,
            line=lines[cfg.line] if cfg.line is not None else None,
            direction=cfg.direction,
            seconds=cfg.seconds or 0.0,
            interval_s=cfg.interval_s,
            crop=cfg.crop,
            own=own,
        )

    def matches_box(self, cls: int, label: str, score: float, zones: Iterable[str]) -> bool:
        """The filters a box passes before its text is known (what is worth reading)."""
        if score < self.min_score:
            return False
        if self.classes is not None and cls not in self.classes and label not in self.labels:
            return False
        return self.zone is None or self.zone in zones

    def matches(self, obs: Observation) -> bool:
        """Whether ``obs`` passes every filter."""
        if not self.matches_box(obs.cls, obs.label, obs.score, obs.zones):
            return False
        if self.text is None:
            return True
        return obs.text is not None and self.text.search(obs.text) is not None


@dataclass(slots=True)
class RuleState:
    """What one rule remembers of one track."""

    fired: bool = False  # appear, leave: raised already; dwell: raised in this stretch
    since: float | None = None  # dwell: when the current matching stretch began
    last: float | None = None  # every: when it last raised
    ref: Point | None = None  # cross: the anchor before, off the line
    matched: Observation | None = None  # leave: the last observation that matched

    def to_json(self) -> list[Any]:
        ref = None if self.ref is None else list(self.ref)
        matched = None if self.matched is None else self.matched.to_json()
        return [self.fired, self.since, self.last, ref, matched]

    @classmethod
    def from_json(cls, v: Any) -> RuleState:
        fired, since, last, ref, matched = v
        return cls(
            bool(fired),
            None if since is None else float(since),
            None if last is None else float(last),
            None if ref is None else (float(ref[0]), float(ref[1])),
            None if matched is None else Observation.from_json(matched),
        )


@dataclass(frozen=True, slots=True)
class Firing:
    """A rule raised an event about ``obs`` (for ``leave``: the track's last match)."""

    rule: Rule
    obs: Observation
    at: float  # the server's clock when it was raised, Unix seconds
    extra: dict[str, Any] = field(default_factory=dict)  # direction, line, dwell_s


def step(rule: Rule, state: RuleState, obs: Observation) -> Firing | None:
    """Advance ``rule`` over the track's next observation ``obs``; the event it raises."""
    hit = rule.matches(obs)
    on = rule.on
    if on == "appear":
        if hit and not state.fired:
            state.fired = True
            return Firing(rule, obs, obs.t)
    elif on == "leave":
        if hit:
            state.matched = obs
    elif on == "cross":
        return _cross(rule, state, obs, hit)
    elif on == "dwell":
        if not hit:
            state.since, state.fired = None, False
            return None
        if state.since is None:
            state.since = obs.t
        held = obs.t - state.since
        if not state.fired and held >= rule.seconds:
            state.fired = True
            return Firing(rule, obs, obs.t, {"dwell_s": round(held, 3)})
    elif on == "every" and hit and (state.last is None or obs.t - state.last >= rule.interval_s):
        state.last = obs.t
        return Firing(rule, obs, obs.t)
    return None


def _cross(rule: Rule, state: RuleState, obs: Observation, hit: bool) -> Firing | None:
    line = rule.line
    if line is None:
        return None
    side = line.side(obs.anchor)
    before = state.ref
    if side == 0:  # on the line: not across yet; the point before stays the reference
        return None
    state.ref = obs.anchor
    if before is None:
        return None
    direction: Direction | None = line.crossing(before, obs.anchor)
    if direction is None or not hit or rule.direction not in ("any", direction):
        return None
    return Firing(rule, obs, obs.t, {"line": line.name, "direction": direction})


def end(rule: Rule, state: RuleState, at: float) -> Firing | None:
    """The track ended at ``at``: ``leave`` raises, with its last matching observation,
    if it ever matched."""
    if rule.on != "leave" or state.matched is None or state.fired:
        return None
    state.fired = True
    return Firing(rule, state.matched, at)


def replay_history(
    rule: Rule, history: Iterable[Observation], ended_at: float | None = None
) -> list[Firing]:
    """Every event ``rule`` raises over one track's ``history`` (its observations in
    frame order), and at its end when ``ended_at`` is given."""
    state = RuleState()
    out = [f for obs in history if (f := step(rule, state, obs)) is not None]
    if ended_at is not None and (f := end(rule, state, ended_at)) is not None:
        out.append(f)
    return out


def zones_of(anchor: Point, zones: Iterable[Zone]) -> tuple[str, ...]:
    """The names of the zones ``anchor`` lies in, in the zones' order."""
    return tuple(z.name for z in zones if z.contains(anchor))
