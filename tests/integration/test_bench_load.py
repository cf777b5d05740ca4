"""The load generator: several cameras driven by one process, and the CPU it reports."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from edge_vision.tools.bench.load import CameraPlan, children_cpu_seconds, cpu_seconds, run_cameras

from ..support.images import text_scene
from ..support.server import RunningServer
from ..support.timing import T

pytestmark = pytest.mark.timeout(120)


async def test_two_processes_drive_four_cameras_and_their_cpu_is_counted(
    server: RunningServer,
) -> None:
    jpegs = [text_scene(640, 360, seed=s).jpeg() for s in range(2)]
    start_at = time.time() + T(1.0)
    plans = [
        CameraPlan(i, server.ws_url, jpegs, fps=2, duration_s=2.0, start_at=start_at, drain_s=T(5))
        for i in range(4)
    ]
    before = children_cpu_seconds()
    results = await asyncio.to_thread(run_cameras, plans, None, 2)
    cameras_cpu = children_cpu_seconds() - before
    # Every camera reported, in order, each with its own answers (two per process).
    assert [r.index for r in results] == [0, 1, 2, 3]
    for r in results:
        assert r.connect_error is None and r.errors == 0
        assert r.sent >= 3 and r.answered + r.dropped == r.sent
    # The two camera processes' CPU came back with them; this process's own is readable.
    assert cameras_cpu > 0
    own = await asyncio.to_thread(cpu_seconds, os.getpid())
    assert own is not None and own > 0
