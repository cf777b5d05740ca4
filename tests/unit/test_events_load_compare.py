"""``benchmarks.events_load``'s verdict as a pure function of made-up runs: medians a side,
their ratio, one-sided (rules must not slow the frame path: a side with rules that
measured better is within), and the latencies of every run of a side pooled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.events_load import FIGURES, compare


def run(variant: str, scale: float, latencies: list[float]) -> dict[str, Any]:
    """A run whose every figure is ``scale`` times a base, answered frames/s included."""
    base = {k: 10.0 for k in FIGURES}
    return {"variant": variant, **{k: v * scale for k, v in base.items()}, "_latencies": latencies}


def test_a_side_with_rules_that_measured_better_is_within_and_one_worse_by_6_percent_is_not() -> (
    None
):
    runs = [
        run("without", 1.0, [50.0, 60.0]),
        run("without", 1.0, [55.0, 65.0]),
        run("with", 0.80, [40.0, 41.0]),  # everything 20 % lower: latency better, rate worse
        run("with", 0.80, [42.0, 43.0]),
    ]
    cmp = compare(runs, 0.05)
    assert cmp["p99_ms"]["ratio"] == pytest.approx(0.8) and cmp["p99_ms"]["within"]
    # Fewer frames answered with rules is a cost, whichever way the latencies went.
    assert not cmp["answered_per_s"]["within"]
    # Everything 6 % higher with rules: latencies worse by more than 5 %, answered better.
    worse = [r for r in runs if r["variant"] == "without"]
    worse += [run("with", 1.06, [60.0, 70.0]), run("with", 1.06, [61.0, 71.0])]
    cmp = compare(worse, 0.05)
    assert cmp["p99_ms"]["ratio"] == pytest.approx(1.06)
    assert not cmp["p99_ms"]["within"] and cmp["answered_per_s"]["within"]


def test_the_pooled_percentiles_take_every_frame_of_a_side_s_runs() -> None:
    slow_run = [100.0] * 5 + [10.0] * 95  # one run's tail; the other run has none
    runs = [
        run("without", 1.0, [10.0] * 100),
        run("without", 1.0, [10.0] * 100),
        run("with", 1.0, slow_run),
        run("with", 1.0, [10.0] * 100),
    ]
    pooled = compare(runs, 0.05)["pooled_p99_ms"]
    assert pooled["median_without"] == pytest.approx(10.0)
    assert pooled["median_with"] == pytest.approx(
        float(np.percentile(slow_run + [10.0] * 100, 99)), abs=0.01
    )
    assert not pooled["within"]
