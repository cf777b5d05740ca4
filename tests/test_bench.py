"""A short smoke run of the benchmark command (real server, camera processes, baseline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .support.timing import T


def bench(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_vision",
            "bench",
            "--out",
            str(out),
            "--frames",
            "8",
            "--resolution",
            "640x360",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=T(240),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict = json.loads((out / "results.json").read_text())  # type: ignore[type-arg]
    result["_stdout"] = proc.stdout
    result["_files"] = sorted(p.name for p in out.iterdir())
    return result


@pytest.mark.timeout(300)
def test_bench_compares_ours_with_the_engine_ceiling_and_the_baseline(tmp_path: Path) -> None:
    r = bench(
        tmp_path,
        "--compare",
        "--cameras",
        "2",
        "--fps",
        "4",
        "--duration",
        "4",
        "--engine-seconds",
        "0.5",
    )
    runs = {run["name"]: run for run in r["runs"]}
    ours, base = runs["edge_vision"], runs["baseline"]
    for run in (ours, base):
        assert run["sent"] == 2 * 4 * 4 and run["errors"] == 0 and run["duplicates"] == 0
        assert run["answered"] + run["dropped"] == run["sent"]
        assert run["latency_ms"]["p50"] > 0
    assert ours["server_stages_ms"]["infer_ms"]["p50"] > 0
    assert r["engine_only"]["rows"][0]["serial"]["frames_per_s"] > 0
    assert "engine ceiling" in r["_stdout"] and "baseline p99" in r["_stdout"]
    assert {"results.json", "latency_cdf.png", "throughput_p99_vs_cameras.png"} <= set(r["_files"])
