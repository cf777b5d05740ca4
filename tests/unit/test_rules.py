"""Zones, lines and rules as pure functions over literal track histories (edge_vision.events):
appear once per track, leave, cross with direction, dwell, every with its rate limit, the
text expression, zone membership by the anchor, and one session's rules across a resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from edge_vision.config import EventsConfig, RuleConfig, SessionEventsSettings, load_config
from edge_vision.errors import ConfigError
from edge_vision.events.geometry import Line, Zone, anchor_point
from edge_vision.events.rules import Observation, Rule, replay_history
from edge_vision.events.session_rules import SessionRules, compile_rules

pytestmark = pytest.mark.timeout(10)

W, H = 1000, 500
CHECK = Zone("check", ((0.2, 0.2), (0.8, 0.2), (0.8, 0.8), (0.2, 0.8)))
GATE = Line("gate", (0.0, 0.5), (1.0, 0.5))  # left to right across the middle


def obs(
    t: float,
    anchor: tuple[float, float],
    *,
    track: int = 1,
    text: str | None = None,
    score: float = 0.9,
    cls: int = 0,
    label: str = "text",
) -> Observation:
    """One track in one frame; its zones are found from ``anchor`` as the session does."""
    zones = tuple(z.name for z in (CHECK,) if z.contains(anchor))
    return Observation(
        track, t, int(t * 10), t * 1000, (0, 0, 1, 1), score, cls, label, anchor, zones, text
    )


def rule(**cfg: Any) -> Rule:
    cfg.setdefault("name", "r")
    return Rule.from_config(RuleConfig.model_validate(cfg), {"gate": GATE})


def fired_at(firings: list[Any]) -> list[float]:
    return [f.obs.t for f in firings]


# -- geometry -----------------------------------------------------------------------------


def test_the_anchor_is_the_box_bottom_centre_by_default_in_frame_fractions() -> None:
    box = [100.0, 50.0, 300.0, 250.0]
    assert anchor_point(box, W, H, "bottom_center") == (0.2, 0.5)
    assert anchor_point(box, W, H, "center") == (0.2, 0.3)


def test_a_zone_holds_points_inside_and_on_its_border_and_not_outside() -> None:
    assert CHECK.contains((0.5, 0.5))
    assert CHECK.contains((0.2, 0.5)) and CHECK.contains((0.5, 0.8))  # borders: in
    assert not CHECK.contains((0.1, 0.5)) and not CHECK.contains((0.5, 0.81))
    # A concave zone (an L): the notch is outside.
    ell = Zone("ell", ((0, 0), (0.5, 0), (0.5, 0.5), (1, 0.5), (1, 1), (0, 1)))
    assert ell.contains((0.25, 0.25)) and ell.contains((0.75, 0.75))
    assert not ell.contains((0.75, 0.25))
    # A box standing on the frame's bottom edge is in a zone drawn down to it.
    floor = Zone("floor", ((0, 0.6), (1, 0.6), (1, 1), (0, 1)))
    assert floor.contains(anchor_point([400, 400, 600, H], W, H, "bottom_center"))


def test_a_line_names_its_crossing_direction_and_ignores_passing_beyond_its_ends() -> None:
    assert GATE.crossing((0.5, 0.4), (0.5, 0.6)) == "forward"  # downwards
    assert GATE.crossing((0.5, 0.6), (0.5, 0.4)) == "backward"
    assert GATE.crossing((0.5, 0.1), (0.5, 0.4)) is None  # same side
    short = Line("short", (0.4, 0.5), (0.6, 0.5))
    assert short.crossing((0.9, 0.4), (0.9, 0.6)) is None  # beyond its right end
    assert short.crossing((0.5, 0.4), (0.5, 0.5)) is None  # onto the line: not across yet


# -- each kind over a track's history ---------------------------------------------------


def test_appear_fires_once_per_track_when_it_first_matches() -> None:
    # Outside the zone for two frames, then inside for five: one event, at the entry.
    history = [obs(i / 10, (0.5, 0.1 if i < 2 else 0.5)) for i in range(7)]
    assert fired_at(replay_history(rule(on="appear", zone="check"), history)) == [0.2]
    # Another track is another appearance.
    other = [obs(i / 10, (0.5, 0.5), track=2) for i in range(3)]
    assert fired_at(replay_history(rule(on="appear"), other)) == [0.0]


def test_leave_fires_at_the_end_of_a_track_that_matched_with_its_last_match() -> None:
    r = rule(on="leave", zone="check")
    history = [obs(0.0, (0.5, 0.5)), obs(0.1, (0.6, 0.6)), obs(0.2, (0.95, 0.6))]
    (f,) = replay_history(r, history, ended_at=1.5)
    assert f.at == 1.5 and f.obs.t == 0.1 and f.obs.anchor == (0.6, 0.6)  # last in the zone
    assert replay_history(r, history) == []  # not before the track ends
    never = [obs(0.0, (0.95, 0.1)), obs(0.1, (0.95, 0.2))]
    assert replay_history(r, never, ended_at=2.0) == []  # never matched: nothing left


def test_cross_fires_on_each_crossing_in_the_rule_s_direction() -> None:
    ys = [0.3, 0.45, 0.5, 0.55, 0.7, 0.6, 0.4, 0.45, 0.6]  # down, back up, down again
    history = [obs(i / 10, (0.5, y)) for i, y in enumerate(ys)]
    both = replay_history(rule(on="cross", line="gate"), history)
    assert [f.extra["direction"] for f in both] == ["forward", "backward", "forward"]
    # Landing on the line (0.5) is not a crossing; leaving it on the far side is.
    assert fired_at(both) == [0.3, 0.6, 0.8]
    down = replay_history(rule(on="cross", line="gate", direction="forward"), history)
    assert fired_at(down) == [0.3, 0.8] and all(f.extra["line"] == "gate" for f in down)
    up = replay_history(rule(on="cross", line="gate", direction="backward"), history)
    assert fired_at(up) == [0.6]


def test_cross_applies_the_filters_to_the_detection_after_the_crossing() -> None:
    history = [obs(0.0, (0.5, 0.4), score=0.9), obs(0.1, (0.5, 0.6), score=0.2)]
    assert replay_history(rule(on="cross", line="gate", min_score=0.5), history) == []


def test_dwell_fires_once_a_track_matched_for_its_seconds_and_again_after_a_break() -> None:
    r = rule(on="dwell", zone="check", seconds=2)
    inside = [obs(0.5 * i, (0.5, 0.5)) for i in range(7)]  # 0 .. 3 s in the zone
    (f,) = replay_history(r, inside)
    assert f.obs.t == 2.0 and f.extra["dwell_s"] == 2.0
    # Frames that missed the track (no observation from 1 s to 2.5 s) do not break it...
    gappy = [obs(0.0, (0.5, 0.5)), obs(0.5, (0.5, 0.5)), obs(2.5, (0.5, 0.5))]
    assert fired_at(replay_history(r, gappy)) == [2.5]
    # ...a frame where it is out of the zone does, and the stretch starts again.
    broken = [obs(t, (0.5, 0.5 if t != 1.5 else 0.95)) for t in (0, 0.5, 1, 1.5, 2, 3, 4)]
    assert fired_at(replay_history(r, broken)) == [4.0]


def test_every_fires_for_each_matching_frame_at_most_once_per_interval() -> None:
    history = [obs(0.25 * i, (0.5, 0.5)) for i in range(9)]  # 0 .. 2 s, 4 frames a second
    assert fired_at(replay_history(rule(on="every", interval_s=1.0), history)) == [0, 1.0, 2.0]
    assert len(replay_history(rule(on="every", interval_s=0), history)) == 9


def test_text_is_a_regular_expression_searched_in_the_text_read() -> None:
    r = rule(on="appear", text=r"^LOT \d{4}$")
    assert replay_history(r, [obs(0, (0.5, 0.5), text="LOT 0042")])
    assert not replay_history(r, [obs(0, (0.5, 0.5), text="LOT 42")])
    assert not replay_history(r, [obs(0, (0.5, 0.5), text=None)])  # not read: no match
    # Read on a later frame: it appears then.
    late = [obs(0, (0.5, 0.5)), obs(0.1, (0.5, 0.5), text="LOT 1234")]
    assert fired_at(replay_history(r, late)) == [0.1]
    assert replay_history(rule(on="appear", text="(?i)lot"), [obs(0, (0.5, 0.5), text="Lot7")])


def test_class_and_min_score_filters() -> None:
    by_label = rule(on="appear", **{"class": "label"})
    assert replay_history(by_label, [obs(0, (0.5, 0.5), label="label", cls=3)])
    assert not replay_history(by_label, [obs(0, (0.5, 0.5), label="text", cls=0)])
    by_index = rule(on="appear", **{"class": [3]})
    assert replay_history(by_index, [obs(0, (0.5, 0.5), label="label", cls=3)])
    low = rule(on="appear", min_score=0.5)
    assert not replay_history(low, [obs(0, (0.5, 0.5), score=0.45)])


# -- the config ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "says"),
    [
        ({"rules": [{"name": "r", "on": "appear", "text": "LOT("}]}, "not a regular expression"),
        ({"rules": [{"name": "r", "on": "appear", "zone": "nowhere"}]}, "no zone named"),
        ({"rules": [{"name": "r", "on": "cross"}]}, "needs 'line'"),
        ({"rules": [{"name": "r", "on": "dwell"}]}, "needs 'seconds'"),
        ({"rules": [{"name": "r", "on": "appear"}] * 2}, "used twice"),
        ({"rules": [{"name": "a/b", "on": "appear"}]}, "name"),
        ({"zones": {"z": [[0, 0], [1, 0]]}}, "3 to 64 points"),
        ({"zones": {"z": [[0, 0], [2, 0], [1, 1]]}}, "fractions of the frame"),
        ({"lines": {"l": [[0, 0], [0, 0]]}}, "the same"),
    ],
)
def test_a_wrong_events_config_is_refused_saying_what_is_wrong(
    events: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match="events") as e:
        load_config(None, environ={}, cli={"events": events})
    assert says in str(e.value)


def test_a_yaml_config_file_with_a_bare_on_key_loads(tmp_path: Any) -> None:
    """YAML 1.1 reads ``on:`` as the boolean true; the rule still gets its kind."""
    path = tmp_path / "events.yaml"
    path.write_text(
        "events:\n  zones: {dock: [[0, 0], [1, 0], [1, 1]]}\n"
        "  rules:\n    - name: lot\n      on: appear\n      zone: dock\n"
    )
    (r,) = load_config(path, environ={}).events.rules
    assert (r.name, r.on, r.zone) == ("lot", "appear", "dock")


# -- one session's rules --------------------------------------------------------------------

NODE = EventsConfig.model_validate(
    {
        "zones": {"check": [[0.2, 0.2], [0.8, 0.2], [0.8, 0.8], [0.2, 0.8]]},
        "lines": {"gate": [[0, 0.5], [1, 0.5]]},
        "rules": [
            {"name": "lot", "on": "appear", "text": "^LOT", "zone": "check"},
            {"name": "gone", "on": "leave", "zone": "check"},
        ],
    }
)


def det(cx: float, bottom: float, score: float = 0.9) -> list[float]:
    """A 100 × 30 px box whose bottom centre is at (cx, bottom), in frame fractions."""
    x, y = cx * W, bottom * H
    return [x - 50, y - 30, x + 50, y, score, 0]


def frame(
    rules: SessionRules, t: float, boxes: list[list[float]], ids: list[int], texts: Any
) -> tuple[list[tuple[str, ...]], list[Any]]:
    return rules.observe(np.array(boxes, np.float32), ids, texts, W, H, t, int(t), t * 1e3)


def test_a_session_s_rules_raise_once_and_its_memory_survives_a_resume() -> None:
    rules = SessionRules.build(NODE, None, lambda c: "text")
    zones, fired = frame(rules, 0.0, [det(0.5, 0.5), det(0.1, 0.9)], [1, 2], ["LOT 7", "LOT 8"])
    assert zones == [("check",), ()]  # what results carry
    assert [(f.rule.name, f.obs.track) for f in fired] == [("lot", 1)]  # 2 is outside
    assert frame(rules, 0.1, [det(0.5, 0.5)], [1], ["LOT 7"])[1] == []  # once per track
    # The session moves to another node: its memory goes through the record (JSON).
    resumed = SessionRules.build(NODE, None, lambda c: "text")
    resumed.restore(json.loads(json.dumps(rules.state())))
    assert frame(resumed, 5.0, [det(0.5, 0.5)], [1], ["LOT 7"])[1] == []  # not raised again
    (left,) = resumed.ended([1], 6.0)
    assert (left.rule.name, left.obs.track, left.at) == ("gone", 1, 6.0)
    assert resumed.ended([1], 6.5) == []  # once


def test_a_rule_with_text_reads_only_the_boxes_it_could_match() -> None:
    rules = SessionRules.build(NODE, None, lambda c: "text")
    boxes = np.array([det(0.5, 0.5), det(0.1, 0.9), det(0.6, 0.6, score=0.2)], np.float32)
    assert rules.needs_text and rules.worth_reading(boxes, W, H) == [True, False, True]


def test_a_session_s_own_rules_add_to_the_node_s_and_may_not_take_its_names() -> None:
    own = SessionEventsSettings.model_validate(
        {
            "zones": {"dock": [[0, 0], [0.5, 0], [0.5, 0.5]]},
            "rules": [{"name": "mine", "on": "appear", "zone": "check"}],
        }
    )
    zones, rules = compile_rules(NODE, own)
    assert [z.name for z in zones] == ["check", "dock"]
    assert [(r.name, r.own) for r in rules] == [("lot", False), ("gone", False), ("mine", True)]
    for clash in (
        {"zones": {"check": [[0, 0], [1, 0], [1, 1]]}},
        {"rules": [{"name": "lot", "on": "appear"}]},
        {"rules": [{"name": "x", "on": "cross", "line": "nope"}]},
    ):
        with pytest.raises(ValueError):
            compile_rules(NODE, SessionEventsSettings.model_validate(clash))
