"""One session's rules over its tracks, frame by frame. Pure, no I/O.

:class:`SessionRules` holds the rules a session runs (the node's ``events.rules`` and
the session's own, from ``settings``), the zones and lines they name, and what each rule
remembers of each live track (:class:`~.rules.RuleState`). The shell feeds it every
answered frame in frame order, with the track ids the session's tracker gave
(:meth:`SessionRules.observe`), and the tracks the tracker forgot
(:meth:`SessionRules.ended`); each call returns the :class:`~.rules.Firing` s to send.

Its memory (:meth:`SessionRules.state`) is plain JSON the session record carries, so a
session resumed on another node neither raises ``appear`` again for a label it already
reported nor forgets a ``dwell`` half-way (times are Unix seconds, the same on every
node).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..common.messages import FrameId
from ..config import EventsConfig, SessionEventsSettings
from ..config.events import check_rules
from .geometry import Anchor, Line, Zone, anchor_point
from .rules import Firing, Observation, Rule, RuleState, end, step

#: Version of :meth:`SessionRules.state`'s layout; another version starts afresh.
STATE_VERSION = 1


def compile_rules(
    node: EventsConfig, own: SessionEventsSettings | None
) -> tuple[list[Zone], list[Rule]]:
    """The zones and rules a session runs: the node's, then the session's own. Raises
    ValueError when the session's own reuse a node name or name what does not exist."""
    zones = dict(node.zones)
    lines = dict(node.lines)
    rules = list(node.rules)
    own_names: set[str] = set()
    if own is not None:
        pairs = (("zone", own.zones, node.zones), ("line", own.lines, node.lines))
        for kind, mine, theirs in pairs:
            clash = sorted(set(mine) & set(theirs))
            if clash:
                raise ValueError(f"{kind} name {clash[0]!r} is the node's already")
        zones.update(own.zones)
        lines.update(own.lines)
        check_rules(own.rules, set(zones), set(lines), {r.name for r in node.rules})
        rules += own.rules
        own_names = {r.name for r in own.rules}
    line_of = {name: Line(name, a, b) for name, (a, b) in lines.items()}
    return (
        [Zone(name, points) for name, points in zones.items()],
        [Rule.from_config(r, line_of, own=r.name in own_names) for r in rules],
    )


class SessionRules:
    """One session's rules and their memory of its live tracks (see the module doc)."""

    def __init__(
        self,
        zones: Sequence[Zone],
        rules: Sequence[Rule],
        label: Callable[[int], str],
        anchor: Anchor = "bottom_center",
    ) -> None:
        self.zones = list(zones)
        self.rules = list(rules)
        self.label = label
        self.anchor: Anchor = anchor
        self._memory: dict[int, dict[str, RuleState]] = {}
        self._text_rules = [r for r in self.rules if r.text is not None]
        # Set when the memory changed since the shell last saved it (state()).
        self.changed = False

    @classmethod
    def build(
        cls,
        node: EventsConfig,
        own: SessionEventsSettings | None,
        label: Callable[[int], str],
    ) -> SessionRules:
        zones, rules = compile_rules(node, own)
        return cls(zones, rules, label, node.anchor)

    @property
    def active(self) -> bool:
        """Whether there is anything to do: rules to run, or zones to place boxes in."""
        return bool(self.rules or self.zones)

    @property
    def needs_text(self) -> bool:
        """A rule has ``text``: the boxes it could match must be read."""
        return bool(self._text_rules)

    @property
    def has_leave(self) -> bool:
        return any(r.on == "leave" for r in self.rules)

    # -- per frame -------------------------------------------------------------------

    def zones_for(
        self, detections: npt.NDArray[np.floating], width: int, height: int
    ) -> list[tuple[str, ...]]:
        """The zones each detection's anchor lies in."""
        zones, anchor = self.zones, self.anchor
        out: list[tuple[str, ...]] = []
        for row in np.asarray(detections).tolist():
            p = anchor_point(row, width, height, anchor)
            out.append(tuple(z.name for z in zones if z.contains(p)))
        return out

    def worth_reading(
        self, detections: npt.NDArray[np.floating], width: int, height: int
    ) -> list[bool]:
        """For each detection: could a rule with ``text`` match it, once read? (The read
        stage reads only those when the session itself does not read.)"""
        rows = np.asarray(detections).reshape(-1, 6).tolist()
        zones = self.zones_for(detections, width, height)
        label = self.label
        return [
            any(
                r.matches_box(int(row[5]), label(int(row[5])), float(row[4]), z)
                for r in self._text_rules
            )
            for row, z in zip(rows, zones, strict=True)
        ]

    def observe(
        self,
        detections: npt.NDArray[np.floating],
        track_ids: Sequence[int],
        texts: Sequence[str | None] | None,
        width: int,
        height: int,
        t: float,
        frame_id: FrameId | None,
        ts: float | int | None,
    ) -> tuple[list[tuple[str, ...]], list[Firing]]:
        """One answered frame: ``detections`` (``(N, 6)``, frame pixels) with their track
        ids and the text read in each (None: not read), seen at ``t`` (Unix seconds).
        Returns the zones of each detection and the events the rules raise, in rule
        order within each detection."""
        rows = np.asarray(detections).reshape(-1, 6).tolist()
        zones, anchor, label = self.zones, self.anchor, self.label
        memory = self._memory
        per_det: list[tuple[str, ...]] = []
        fired: list[Firing] = []
        for i, row in enumerate(rows):
            p = anchor_point(row, width, height, anchor)
            in_zones = tuple(z.name for z in zones if z.contains(p))
            per_det.append(in_zones)
            if not self.rules:
                continue
            cls = int(row[5])
            track = int(track_ids[i])
            obs = Observation(
                track,
                t,
                frame_id,
                ts,
                (row[0], row[1], row[2], row[3]),
                row[4],
                cls,
                label(cls),
                p,
                in_zones,
                texts[i] if texts is not None else None,
            )
            states = memory.get(track)
            if states is None:
                states = memory[track] = {}
                self.changed = True
            for rule in self.rules:
                state = states.get(rule.name)
                if state is None:
                    state = states[rule.name] = RuleState()
                f = step(rule, state, obs)
                if f is not None:
                    fired.append(f)
                    self.changed = True
        return per_det, fired

    def ended(self, track_ids: Sequence[int], at: float) -> list[Firing]:
        """The tracker forgot these tracks at ``at`` (Unix seconds): ``leave`` rules
        raise for those that matched; their memory goes."""
        fired: list[Firing] = []
        for track in track_ids:
            states = self._memory.pop(track, None)
            if states is None:
                continue
            self.changed = True
            for rule in self.rules:
                state = states.get(rule.name)
                if state is not None and (f := end(rule, state, at)) is not None:
                    fired.append(f)
        return fired

    def end_all(self, at: float) -> list[Firing]:
        """The session ended: every live track ends."""
        return self.ended(list(self._memory), at)

    # -- the session record ----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This memory as plain JSON values (:meth:`restore` reads it back)."""
        self.changed = False
        return {
            "v": STATE_VERSION,
            "tracks": {
                str(track): {name: s.to_json() for name, s in states.items()}
                for track, states in self._memory.items()
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Carry on from :meth:`state`'s output (kept for the rules this session still
        has). ValueError when it cannot be read."""
        if not state:
            return
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"not a rules state of version {STATE_VERSION}")
        names = {r.name for r in self.rules}
        memory: dict[int, dict[str, RuleState]] = {}
        try:
            for track, states in state["tracks"].items():
                memory[int(track)] = {
                    name: RuleState.from_json(v) for name, v in states.items() if name in names
                }
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"unreadable rules state: {e}") from None
        self._memory = memory

    def carry_from(self, other: SessionRules) -> None:
        """Keep ``other``'s memory for the rules of the same name (the session's rules
        changed: the others' tracks are not raised again)."""
        names = {r.name for r in self.rules}
        self._memory = {
            track: {n: s for n, s in states.items() if n in names}
            for track, states in other._memory.items()
        }
        self.changed = True
