"""The INT8 accuracy gate: an INT8 plan whose detections agree with ONNX Runtime's on
held-back calibration frames is used; one that does not is refused, with the figures,
and FP16 is used instead (logged, remembered). TensorRT is the MOCK of
tests/support/mock_tensorrt.py; "a plan that does not agree" is made by mocking the INT8
engine's detections (real TensorRT cannot run here)."""

from __future__ import annotations

import asyncio
import json
import logging
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_vision.cli import main
from edge_vision.engines import create_engine
from edge_vision.engines.tensorrt import int8_gate
from edge_vision.model.spec import ModelSpec

from ..support.mock_tensorrt import MockState, mock_trt  # noqa: F401 - the fixture
from ..support.server import make_config
from ..support.video import write_image_folder

pytestmark = pytest.mark.timeout(180)


def dets(*rows: tuple[float, ...]) -> np.ndarray:
    return np.array(rows, np.float32).reshape(-1, 6)


BOX_A = (10, 10, 60, 30, 0.9, 0)
BOX_B = (100, 40, 180, 70, 0.8, 0)


def test_judge_accepts_agreeing_detections_and_refuses_missing_ones_with_figures() -> None:
    ref = [dets(BOX_A, BOX_B), dets(BOX_A)]
    same = int8_gate.judge(ref, [d.copy() for d in ref], min_agreement=0.95)
    assert same.accepted and same.agreement.score == 1.0 and same.frames == 2
    lost = int8_gate.judge(ref, [dets(BOX_A), dets()], min_agreement=0.95)
    assert not lost.accepted
    assert lost.agreement.recall == pytest.approx(1 / 3) and lost.agreement.precision == 1.0
    summary = lost.as_dict()["summary"]
    assert summary.startswith("INT8 REFUSED: agreement 0.333 (min 0.95)")
    assert "1 of 3 reference boxes matched" in summary
    assert int8_gate.judge(ref, [dets(BOX_A), dets()], min_agreement=0.3).accepted


def int8_argv(spec: ModelSpec, tmp_path: Path, *extra: str) -> list[str]:
    write_image_folder(tmp_path / "frames", 480, 270, frames=6)
    return [
        "build-engine",
        str(spec.path),
        "--precision",
        "int8",
        "--calibration",
        str(tmp_path / "frames"),
        "--calibration-frames",
        "4",
        "--engine-dir",
        str(tmp_path / "engines"),
        "--set",
        "engine.tensorrt.calibration_batch=2",
        "--set",
        "engine.tensorrt.int8_gate_frames=2",
        "--set",
        "engine.max_batch=4",  # the plan's profile: batches of 1..4, as trt_config's
        *extra,
    ]


def records(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text()) for p in folder.glob("*.json") if "refused" not in p.name
    }


def test_an_int8_plan_that_agrees_is_kept_and_build_engine_prints_the_agreement_mock_tensorrt(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    assert main(int8_argv(spec, tmp_path)) == 0
    out = capsys.readouterr().out
    # The mock "plan" runs the model itself, so it agrees with ONNX Runtime exactly.
    assert "INT8 accepted: agreement 1.000 (min 0.95) with ONNX Runtime on 2 held-back" in out
    (record,) = records(tmp_path / "engines").values()
    assert record["fields"]["precision"] == "int8"
    gate = record["extra"]["int8_gate"]
    assert gate["accepted"] is True and gate["reference"] > 0 and gate["held_back"] is True
    assert len(state.builds) == 1 and state.builds[0]["flags"] == ["FP16", "INT8"]


def test_an_int8_plan_that_disagrees_is_refused_and_fp16_is_used_mock_tensorrt(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, _ = mock_trt
    real = int8_gate.detections_of

    async def int8_loses_boxes(
        kind: str, spec: ModelSpec, config: Any, frames: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        got = await real(kind, spec, config, frames)
        if kind == "tensorrt":  # the INT8 plan misses every box of the first frame
            return [d[:0] if i == 0 else d for i, d in enumerate(got)]
        return got

    monkeypatch.setattr(int8_gate, "detections_of", int8_loses_boxes)
    argv = int8_argv(spec, tmp_path)
    with caplog.at_level(logging.WARNING, logger="edge_vision.engines.tensorrt.int8_gate"):
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "INT8 REFUSED: agreement" in out and "(min 0.95)" in out
    assert "falling back to the FP16 plan" in caplog.text
    assert "INT8 REFUSED" in caplog.text
    # Two builds: the INT8 one (refused, never written) and the FP16 one used instead.
    assert [b["flags"] for b in state.builds] == [["FP16", "INT8"], ["FP16"]]
    engines = tmp_path / "engines"
    (record,) = records(engines).values()
    assert record["fields"]["precision"] == "fp16"
    (refusal,) = engines.glob("*.int8-refused.json")
    assert json.loads(refusal.read_text())["accepted"] is False
    assert "key: " in out and ", fp16)" in out

    # Serving with the INT8 config uses the FP16 plan and builds nothing: refused before.
    caplog.clear()
    config = make_config(
        {
            "engine": {
                "kind": "tensorrt",
                "max_batch": 4,
                "in_flight": 1,
                "tensorrt": {
                    "engine_dir": str(engines),
                    "precision": "int8",
                    "calibration_source": str(tmp_path / "frames"),
                    "calibration_frames": 4,
                    "calibration_batch": 2,
                    "int8_gate_frames": 2,
                },
            }
        }
    )
    engine = create_engine("tensorrt", spec, config)

    async def start_and_describe() -> dict[str, Any]:
        await engine.start()
        try:
            return engine.describe()
        finally:
            await engine.close()

    with caplog.at_level(logging.WARNING, logger="edge_vision.engines.tensorrt.int8_gate"):
        described = asyncio.run(start_and_describe())
    assert described["precision"] == "fp16" and "INT8 REFUSED" in described["int8_gate"]
    assert "falling back to the FP16 plan" in caplog.text and "--force" in caplog.text
    assert len(state.builds) == 2

    # --force judges INT8 again (and it still disagrees).
    assert main([*argv, "--force"]) == 0
    assert [b["flags"] for b in state.builds][2] == ["FP16", "INT8"]
