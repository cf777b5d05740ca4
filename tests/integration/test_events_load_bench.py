"""``python -m benchmarks.events_load``, tiny: one pair of camera-load runs against real
servers, one without rules and one with the ten rules, each run's figures and the
medians' ratios written, and the tail pooled over every frame (docs/benchmarks.md quotes
the full run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..support.lab import small_bench
from ..support.timing import T


@pytest.mark.timeout(240)
def test_the_events_load_bench_alternates_servers_without_and_with_ten_rules(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bench"
    proc, _ = small_bench(
        "events_load",
        *("--pairs", "1", "--cameras", "1", "--fps", "2", "--duration", "3"),
        *("--resolution", "640x360", "--out", str(out)),
        json_out=None,
        timeout=T(200),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads((out / "results.json").read_text())
    assert "partial" not in report and report["load"]["cameras"] == 1
    runs = report["runs"]
    assert [r["variant"] for r in runs] == ["without", "with"]
    for r in runs:
        assert r["sent"] > 0 and r["answered"] > 0 and r["errors"] == 0, r
        assert r["answered_per_s"] > 0 and 0 < r["p50_ms"] <= r["p95_ms"], r
        assert r["server_cpu_s_per_1000"] > 0 and r["loadavg_before"], r
    # The rules ran on the server with them (its /metrics), and only there.
    assert runs[0]["events_raised"] == 0 and runs[1]["events_raised"] > 0
    assert set(report["compare"]) >= {"answered_per_s", "p50_ms", "p95_ms", "server_cpu_s_per_1000"}
    for c in report["compare"].values():
        assert c["ratio"] == pytest.approx(c["median_with"] / c["median_without"], rel=1e-3)
    # The cameras heard the rules' events by rule, only where there were rules; a 3-s run
    # is too short for every rule (dwell 5 s), and the verdict says which stayed silent.
    assert runs[0]["events_by_rule"] == {} and runs[1]["events_by_rule"]
    assert sum(runs[1]["events_by_rule"].values()) <= runs[1]["events_raised"]
    assert set(runs[1]["events_by_rule"]) | set(report["rules_silent_in_a_run"]) >= {"d2"}
    assert report["every_rule_fired"] is (not report["rules_silent_in_a_run"])
    assert "d2" in report["rules_silent_in_a_run"] and report["within_tolerance"] is False
    # Every answered frame's latency kept by run, and the tail pooled over them.
    each = json.loads((out / "latencies.json").read_text())
    assert sorted(each) == ["01-without", "02-with"]
    assert [len(each[k]) for k in sorted(each)] == [r["answered"] for r in runs]
    pooled = report["compare"]["pooled_p99_ms"]
    assert pooled["median_with"] == pytest.approx(
        float(np.percentile(each["02-with"], 99)), abs=0.01
    )
    assert "_latencies" not in runs[0]
    assert isinstance(report["within_tolerance"], bool)
    assert report["loadavg_start"] and report["loadavg_end"]
    assert "medians" in proc.stdout and "loadavg: start" in proc.stdout
