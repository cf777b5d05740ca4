"""The search behind ``edge-vision tune``, without I/O: which settings to try, in what order,
within what time, and which trial is best for a stated load.

A trial runs the real server with some settings against the load and reports what the
cameras saw (:class:`Trial`). :func:`search` starts from the settings the node would run
anyway (``engine.kind: auto``'s), then tries each knob's other values one knob at a time,
keeping a value when it beats the best so far (coordinate descent: a handful of knobs
whose effects are nearly independent, each with two or three values worth trying). It
stops when the budget cannot pay for another trial, or at once when the engine alone
cannot serve the load (its measured ceiling is below the frames a second asked for).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The share of frames a trial must answer to hold the load (the bench's and the issues'
#: "answered" bar: latest-wins may drop a few frames under any load).
MIN_ANSWERED = 0.995


@dataclass(frozen=True, slots=True)
class Target:
    """The load to serve: ``cameras`` × ``fps``, each frame answered within ``p99_ms``."""

    cameras: int
    fps: float
    p99_ms: float
    min_answered: float = MIN_ANSWERED

    @property
    def frames_per_s(self) -> float:
        return self.cameras * self.fps


#: The load ``tune`` fits when none is given: cameras at this rate...
DEFAULT_FPS = 30.0
#: ...each frame answered within this (unless the engine's own frame takes too long).
DEFAULT_P99_MS = 50.0
#: The share of the engine's ceiling a default load of cameras may ask (a fifth to spare).
HEADROOM = 0.8
#: On an engine slower than one camera at DEFAULT_FPS: the share one camera may ask, and
#: its p99 in frames' times (its own, one other frame's turn ahead of it, and the tail).
#: Both leave room enough that the 2-second ceiling's run-to-run spread (18-23 frames/s
#: on the 2-core development machine) does not change the load tuned for.
SLOW_ENGINE_SHARE = 0.6
SLOW_ENGINE_P99_FRAMES = 3.0


def default_target(
    ceiling_fps: float,
    frame_ms: float,
    cameras: int | None = None,
    fps: float | None = None,
    p99_ms: float | None = None,
) -> tuple[Target, list[str]]:
    """The load to tune for, from what the user gave (None: not given), the engine's
    measured ceiling (frames a second at its best batch) and its median time for one
    frame; with a line for each default that had to move for this machine.

    Defaults: as many cameras at :data:`DEFAULT_FPS` as :data:`HEADROOM` of the ceiling
    holds, each within :data:`DEFAULT_P99_MS`. Where one camera at 30 fps is already more
    than that (a small CPU), one camera at the largest round rate within
    :data:`SLOW_ENGINE_SHARE` of the ceiling; where :data:`SLOW_ENGINE_P99_FRAMES` of the
    engine's own frames take longer than 50 ms, that long. A value the user gave is kept
    as given: the search then says at once if the engine cannot serve it."""
    notes: list[str] = []
    rate = DEFAULT_FPS if fps is None else fps
    if fps is None and cameras is None and HEADROOM * ceiling_fps < DEFAULT_FPS:
        share = SLOW_ENGINE_SHARE * ceiling_fps
        rate = float(max(1, math.floor(share / 5) * 5 if share >= 5 else math.floor(share)))
        notes.append(
            f"one camera at {DEFAULT_FPS:g} fps is more than this engine serves with room to "
            f"spare ({ceiling_fps:.0f} frames/s): tuning for {rate:g} fps (--fps chooses)"
        )
    count = cameras if cameras is not None else max(1, int(HEADROOM * ceiling_fps // rate))
    p99 = DEFAULT_P99_MS if p99_ms is None else p99_ms
    frames = SLOW_ENGINE_P99_FRAMES * frame_ms
    if p99_ms is None and frames > DEFAULT_P99_MS:
        p99 = float(math.ceil(frames / 10) * 10)
        notes.append(
            f"this engine takes {frame_ms:.0f} ms for one frame, so a p99 of "
            f"{DEFAULT_P99_MS:g} ms cannot hold: tuning for {p99:g} ms "
            f"({SLOW_ENGINE_P99_FRAMES:g} frames' time; --p99-ms chooses)"
        )
    return Target(count, rate, p99), notes


@dataclass(frozen=True, slots=True)
class Knob:
    """A setting worth searching: its dotted config key, the values to try, and why."""

    key: str
    values: tuple[Any, ...]
    why: str


@dataclass(frozen=True, slots=True)
class Trial:
    """What the cameras saw with ``settings``: the share of frames answered, their p99,
    and the server's CPU seconds a 1,000 answered frames (None where unmeasured)."""

    settings: Mapping[str, Any]
    answered: float
    p99_ms: float
    cpu_per_1000: float | None = None
    seconds: float = 0.0  # what the trial cost, start-up included

    def holds(self, target: Target) -> bool:
        return self.answered >= target.min_answered and self.p99_ms <= target.p99_ms


def rank(trial: Trial, target: Target) -> tuple[float, ...]:
    """Larger is better. A trial that holds the load beats one that does not; among those
    that hold, the one that costs the server less CPU a frame (headroom), then the lower
    p99; among those that do not, the one that answers more, then the lower p99."""
    if trial.holds(target):
        cpu = trial.cpu_per_1000 if trial.cpu_per_1000 is not None else math.inf
        return (1.0, -round(cpu, 2), -trial.p99_ms)
    return (0.0, round(trial.answered, 3), -trial.p99_ms)


@dataclass(slots=True)
class Outcome:
    """The search's result: the best trial, every trial in order, and why it stopped."""

    best: Trial | None
    trials: list[Trial] = field(default_factory=list)
    stopped: str = "every value of every knob tried"


def search(
    target: Target,
    start: Mapping[str, Any],
    knobs: Sequence[Knob],
    measure: Callable[[Mapping[str, Any]], Trial],
    budget_s: float,
    *,
    trial_cost_s: float,
    clock: Callable[[], float],
    ceiling_fps: float | None = None,
    on_trial: Callable[[Trial, Trial], None] | None = None,
) -> Outcome:
    """The best settings for ``target`` found within ``budget_s`` (by ``clock``).

    ``start``: the settings the node runs anyway; ``measure``: one trial of a full set of
    settings; ``trial_cost_s``: the first guess at a trial's cost (later ones are judged by
    the longest trial so far); ``ceiling_fps``: the engine's own frames a second, when
    measured; ``on_trial(trial, best)``: called after each trial (progress, reports)."""
    if ceiling_fps is not None and target.frames_per_s > ceiling_fps:
        held = int(ceiling_fps // target.fps) if target.fps > 0 else 0
        fits = (
            f"at most about {held} cameras at {target.fps:g} fps here"
            if held
            else f"not one camera at {target.fps:g} fps: --fps {max(1, int(ceiling_fps))} "
            "or less fits one"
        )
        return Outcome(
            None,
            stopped=f"the engine alone serves {ceiling_fps:.0f} frames/s and the load asks "
            f"{target.frames_per_s:.0f}: no setting can hold it ({fits})",
        )
    began = clock()
    outcome = Outcome(None)
    longest = trial_cost_s

    def affordable() -> bool:
        return clock() - began + longest <= budget_s

    def run(settings: Mapping[str, Any]) -> Trial:
        """One trial; the best trial so far."""
        nonlocal longest
        trial = measure(dict(settings))
        longest = max(longest, trial.seconds)
        outcome.trials.append(trial)
        best = outcome.best
        if best is None or rank(trial, target) > rank(best, target):
            best = outcome.best = trial
        if on_trial is not None:
            on_trial(trial, best)
        return best

    if not affordable():
        outcome.stopped = f"a trial takes about {longest:.0f} s, more than the budget"
        return outcome
    best = run(start)
    tried = {_key(start)}
    for knob in knobs:
        for value in knob.values:
            settings = {**best.settings, knob.key: value}
            if _key(settings) in tried:
                continue
            if not affordable():
                outcome.stopped = f"the budget ({budget_s:.0f} s) is spent"
                return outcome
            tried.add(_key(settings))
            best = run(settings)
    return outcome


def _key(settings: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in settings.items()))
