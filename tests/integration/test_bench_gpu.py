"""``edge-vision bench`` records the node's GPU memory and utilisation beside each run from
``nvidia-smi`` where it is (here a stand-in script that prints what the driver's does, on
the PATH of a real bench run), and nothing where it is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_vision.tools.bench.gpu import GpuSampler

from ..support.timing import T

FAKE_SMI = """#!/bin/sh
# What nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits
# prints on a node of two GPUs.
echo "9000, 80"
echo "1000, 40"
"""


def fake_smi(folder: Path) -> Path:
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return smi


def test_the_sampler_reads_every_gpu_of_the_node_while_a_run_goes_on(tmp_path: Path) -> None:
    sampler = GpuSampler.start(every_s=0.05, smi=str(fake_smi(tmp_path)))
    time.sleep(0.3)
    fields = sampler.stop()
    assert fields["gpu_mem_mib"] == 10000.0 and fields["gpu_util_pct"] == 60.0
    assert len(fields["gpu_samples"]) >= 2


@pytest.mark.timeout(240)
def test_a_bench_run_carries_gpu_memory_where_nvidia_smi_is_and_none_where_not(
    tmp_path: Path,
) -> None:
    def run(path: str, out: Path) -> dict:  # type: ignore[type-arg]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "edge_vision",
                "bench",
                "--out",
                str(out),
                "--frames",
                "4",
                "--resolution",
                "320x192",
                "--cameras",
                "1",
                "--fps",
                "2",
                "--duration",
                "2",
                "--no-plots",
            ],
            capture_output=True,
            text=True,
            timeout=T(200),
            env={**os.environ, "PATH": path},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs: list[dict] = json.loads((out / "results.json").read_text())["runs"]  # type: ignore[type-arg]
        return runs[0]

    fake_smi(tmp_path)
    with_gpu = run(f"{tmp_path}{os.pathsep}{os.environ['PATH']}", tmp_path / "a")
    assert with_gpu["gpu_mem_mib"] == 10000.0 and with_gpu["gpu_util_pct"] == 60.0
    plain_path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
    )
    without = run(plain_path, tmp_path / "b")
    assert "gpu_mem_mib" not in without and "gpu_util_pct" not in without
