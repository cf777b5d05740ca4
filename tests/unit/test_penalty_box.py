"""The slow-client penalty (edge_vision/serve/limits.py, PenaltyBox): a plain object, a
clock the test turns."""

from __future__ import annotations

from edge_vision.serve.limits import PenaltyBox


def test_an_address_is_refused_after_its_strikes_and_only_for_the_penalty() -> None:
    now = [0.0]
    box = PenaltyBox(3, 60.0, clock=lambda: now[0])
    assert not box.strike("10.0.0.7") and not box.strike("10.0.0.7")
    assert box.refused_for("10.0.0.7") == 0
    assert box.strike("10.0.0.7")  # the third: the penalty starts, said once
    assert not box.strike("10.0.0.7")  # a strike during the penalty starts nothing new
    assert box.refused_for("10.0.0.7") == 60 and box.refused_for("10.0.0.8") == 0
    now[0] = 59.5
    assert 0 < box.refused_for("10.0.0.7") <= 0.5
    now[0] = 60.0
    assert box.refused_for("10.0.0.7") == 0
    message = box.message(42.1)
    assert "43 s" in message and "limits.slow_client_strikes" in message


def test_strikes_older_than_the_window_are_forgotten() -> None:
    now = [0.0]
    box = PenaltyBox(2, 10.0, clock=lambda: now[0])
    assert not box.strike("a")
    now[0] = 10.5
    assert not box.strike("a")  # the first fell out of the window
    now[0] = 11.0
    assert box.strike("a")


def test_penalty_zero_turns_it_off_and_memory_is_bounded() -> None:
    off = PenaltyBox(1, 0.0)
    assert not off.strike("a") and off.refused_for("a") == 0
    box = PenaltyBox(5, 60.0)
    for i in range(PenaltyBox.MAX_ADDRESSES + 100):
        box.strike(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
    assert len(box._strikes) <= PenaltyBox.MAX_ADDRESSES
