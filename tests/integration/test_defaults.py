"""Right out of the box: with no engine flag the node picks the engine this machine
should run (engine.kind auto) and says why — in the log, in /readyz and in doctor. This
machine has no NVIDIA GPU, so the choice is ONNX Runtime with the CPU's own defaults; the
GPU branches are tested on described machines in tests/unit/test_engine_choice.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from ..support.server import ServerProcess
from ..support.timing import T


def test_print_config_shows_the_engine_this_machine_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edge_vision", "serve", "--print-config"],
        capture_output=True,
        text=True,
        timeout=T(60),
        check=True,
    )
    assert "kind: onnxruntime" in out.stdout and "kind: auto" not in out.stdout
    assert "engine.kind auto: onnxruntime (no NVIDIA GPU found" in out.stderr


@pytest.mark.timeout(120)
async def test_a_no_flag_server_serves_on_onnx_runtime_and_says_why(tmp_path: Path) -> None:
    server = ServerProcess(log_path=tmp_path / "serve.log")
    await asyncio.to_thread(server.start)
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession() as s, s.get(server.url + "/readyz") as r:
            body = await r.json()
        assert body["engine"]["active"] == "onnxruntime"
        choice = body["engine_choice"]
        assert choice["kind"] == "onnxruntime" and choice["gpu"] is False
        assert "no NVIDIA GPU" in choice["reason"]
    finally:
        await asyncio.to_thread(server.stop)
    log = await asyncio.to_thread(server.log)
    assert "engine.kind auto: onnxruntime (no NVIDIA GPU found" in log


def test_doctor_reports_the_engine_choice(tmp_path: Path) -> None:
    out_file = tmp_path / "doctor.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_vision",
            "doctor",
            "--skip-latency",
            "--seconds",
            "0.2",
            "--json",
            str(out_file),
        ],
        capture_output=True,
        text=True,
        timeout=T(180),
        check=False,
    )
    report = json.loads(out_file.read_text())
    assert report["engine_choice"]["kind"] == "onnxruntime"
    (check,) = [c for c in report["checks"] if c["name"] == "engine choice"]
    assert check["summary"].startswith("onnxruntime: no NVIDIA GPU found")
