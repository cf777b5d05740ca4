"""In-process replay measures what the server does: one session core under both.

The same clip, settings and pacing go through ``edge-vision replay`` in-process and through
a real server on a loopback port (replay as its WebSocket client). The engine is the real
embedded model, wrapped so that every batch takes a fixed time (``ENGINE_S``, well above
the model's own time at this input size on a 2-core machine): which frames latest-wins
drops then depends on the rules, not on the machine's mood, so the two runs must agree
on answered and dropped counts within one frame, in both modes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from edge_vision.common.sources import Cut
from edge_vision.engines.onnxruntime import OnnxRuntimeEngine
from edge_vision.tools import replay
from edge_vision.tools.replay import ReplayOptions

from ..support.server import make_config, running_server
from ..support.timing import T
from ..support.video import TextClip, write_text_clip

#: Engine time per batch: the model itself takes ~15-60 ms at a 160 input here.
ENGINE_S = 0.25
FPS = 10.0  # one frame each 100 ms: about 2.5 frames arrive per engine batch
SETTINGS: dict[str, Any] = {
    "model": {"input_size": 160},
    "engine": {"max_batch": 1, "in_flight": 1, "warmup_shapes": [[96, 160]]},
}

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fixed_time_engine(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The real ONNX Runtime model, each batch padded to ``ENGINE_S``; returns the
    model's own times, so the test can show the padding dominated."""
    real = OnnxRuntimeEngine.infer
    own: list[float] = []

    async def infer(self: OnnxRuntimeEngine, frames: Sequence[Any]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        outputs = await real(self, frames)
        spent = time.perf_counter() - t0
        own.append(spent)
        await asyncio.sleep(max(0.0, ENGINE_S - spent))
        return outputs

    monkeypatch.setattr(OnnxRuntimeEngine, "infer", infer)
    return own


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> TextClip:
    media = tmp_path_factory.mktemp("parity")
    return write_text_clip(media / "parity.mp4", 640, 360, frames=40, fps=FPS)


def run(opts: ReplayOptions, config: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One replay in its own thread and loop, as the command runs; summary and lines."""
    summary, code = asyncio.run(replay.replay(opts, config))
    assert code == 0, summary
    assert opts.jsonl is not None
    lines = [orjson.loads(ln) for ln in opts.jsonl.read_bytes().splitlines()]
    return summary, lines


@pytest.mark.parametrize(("mode", "frames"), [("latest", 40), ("every", 12)])
async def test_in_process_replay_and_the_server_answer_and_drop_the_same_frames(
    fixed_time_engine: list[float], clip: TextClip, tmp_path: Path, mode: str, frames: int
) -> None:
    config = make_config(SETTINGS)
    cut = Cut(duration_s=frames / FPS) if frames < clip.frames else Cut()
    common: dict[str, Any] = {"input": str(clip.path), "mode": mode, "cut": cut}
    local_opts = ReplayOptions(**common, jsonl=tmp_path / "local.jsonl", progress=False)
    local, local_lines = await asyncio.to_thread(run, local_opts, config)
    async with running_server(config) as srv:
        remote_opts = ReplayOptions(
            **common, url=srv.ws_url, jsonl=tmp_path / "remote.jsonl", progress=False
        )
        remote, remote_lines = await asyncio.to_thread(run, remote_opts)

    # The padding, not the model, set the pace (else the comparison would mean nothing).
    assert sorted(fixed_time_engine)[len(fixed_time_engine) // 2] < ENGINE_S * 0.6
    for s, lines in ((local, local_lines), (remote, remote_lines)):
        assert s["frames"] == len(lines) >= frames - 1
        assert s["answered"] + s["dropped"] == frames, s
        assert lines[-1]["status"] == "answered"  # the last frame is always answered
    counts = {k: (s["answered"], s["dropped"]) for k, s in (("local", local), ("remote", remote))}
    print(f"{mode}: (answered, dropped) {counts}")  # the numbers for the record (-s)
    assert local["frames"] == remote["frames"]
    frames = local["frames"]
    if mode == "every":
        assert local["answered"] == remote["answered"] == frames
        assert local["dropped"] == remote["dropped"] == 0
    else:
        # About one answer per engine batch over the clip's 4 s: most frames dropped.
        assert local["dropped"] > frames // 2 and remote["dropped"] > frames // 2
        assert abs(local["answered"] - remote["answered"]) <= 1, (local, remote)
        assert abs(local["dropped"] - remote["dropped"]) <= 1, (local, remote)
        assert remote["server_dropped"] == remote["dropped"]
        # The same rules pick fresh frames in both: an answered frame (but the last)
        # waited at most about one engine batch plus one camera interval.
        bound_ms = (2 * ENGINE_S + 1 / FPS) * 1000 + T(1) * 150
        for lines in (local_lines, remote_lines):
            answered = [ln for ln in lines if ln["status"] == "answered"][:-1]
            assert all(ln["timing"]["latency_ms"] <= bound_ms for ln in answered), answered
