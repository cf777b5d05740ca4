"""``edge-vision tune`` on this CPU machine, as a user runs it: a small budget, a light
load. What it writes is a config ``serve --config`` accepts and serves with, and the
config reads back as what the report says was best."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from edge_vision.config import load_config

from ..support.server import ServerProcess
from ..support.timing import T


@pytest.mark.timeout(300)
def test_tune_writes_a_config_that_serve_accepts_and_serves(tmp_path: Path) -> None:
    out = tmp_path / "tuned.yaml"
    argv = [sys.executable, "-m", "edge_vision", "tune", "--cameras", "1", "--fps", "2"]
    argv += ["--p99-ms", "3000", "--budget-s", "45", "--trial-s", "3", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=T(240), check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    report = json.loads((tmp_path / "tuned-tune" / "tune.json").read_text())
    assert report["trials"] and report["best"] is not None
    assert report["engine_choice"]["kind"] == "onnxruntime"
    assert (tmp_path / "tuned-tune" / "report.md").read_text().startswith("| # |")

    text = out.read_text()
    assert text.startswith("# edge-vision tune")
    config = load_config(out, environ={})  # round-trips: every key is a real config key
    assert config.engine.kind == "onnxruntime"
    for key, value in report["best"].items():
        node = config
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value, key

    assert asyncio.run(_serve_with(out, tmp_path)) == "onnxruntime"


async def _serve_with(config: Path, tmp_path: Path) -> str:
    """The engine a server started with ``--config config`` serves on, once ready."""
    server = ServerProcess(log_path=tmp_path / "serve.log")
    server.args += ["--config", str(config)]
    await asyncio.to_thread(server.start)
    try:
        await server.wait_ready(timeout=90)
        async with aiohttp.ClientSession() as s, s.get(server.url + "/readyz") as r:
            body = await r.json()
        assert body["ready"] is True
        return str(body["engine"]["active"])
    finally:
        await asyncio.to_thread(server.stop)
