"""``edge-vision doctor``: on this CPU machine every check is there, the GPU and TensorRT
ones say "not available" with the reason, ONNX Runtime really runs; with the MOCK
TensorRT (tests/support/mock_tensorrt.py) the plan and engine paths run too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_vision.tools import doctor as doctor_module
from edge_vision.tools.doctor import (
    FAIL,
    NA,
    PASS,
    Doctor,
    DoctorOptions,
    jetpack_for_l4t,
    mps_pipe_dir,
    parse_l4t_release,
    relative_error,
)

from ..support.mock_tensorrt import MockCudaRuntime, MockState, mock_trt  # noqa: F401 - fixture
from ..support.server import make_config

pytestmark = pytest.mark.timeout(180)

#: Every check doctor runs on a machine without a GPU, by name.
CPU_CHECKS = {
    "platform",
    "engine choice",
    "jetpack / l4t",
    "cuda",
    "cuda layer",
    "gpu sharing (mps)",
    "tensorrt",
    "dla cores",
    "jpeg decoder",
    "tensorrt plan",
    "onnxruntime (cpu) on a real frame",
    "engine vs onnxruntime",
    "latency onnxruntime",
}
NEEDS_GPU_OR_TENSORRT = {
    "cuda",
    "cuda layer",
    "gpu sharing (mps)",
    "tensorrt",
    "dla cores",
    "tensorrt plan",
}


def test_doctor_on_this_cpu_machine_reports_every_check_and_exits_0(tmp_path: Path) -> None:
    report_path = tmp_path / "doctor.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_vision",
            "doctor",
            "--seconds",
            "0.3",
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out
    assert "OK: 1 passed, 0 failed" in done.stdout
    report = json.loads(report_path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == CPU_CHECKS
    for name in NEEDS_GPU_OR_TENSORRT | {"jetpack / l4t", "engine vs onnxruntime"}:
        assert checks[name]["status"] == NA, checks[name]
        assert len(checks[name]["summary"]) > 10, checks[name]  # the reason
        assert f"{name:<34} {NA}" in done.stdout
    assert "TensorRT" in checks["tensorrt"]["summary"]
    assert "not a Jetson" in checks["jetpack / l4t"]["summary"]
    assert "torch" in checks["engine vs onnxruntime"]["summary"]
    ort = checks["onnxruntime (cpu) on a real frame"]
    assert ort["status"] == PASS and ort["details"]["detections"] >= 1
    latency = checks["latency onnxruntime"]
    assert latency["details"]["rows"][0]["serial"]["frames_per_s"] > 0
    assert "1 frame: p50" in latency["summary"]
    assert report["failed"] == [] and "date" in report


def test_l4t_release_lines_name_the_jetpack() -> None:
    orin = (
        "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
        "DATE: Mon May  6 17:34:21 UTC 2024"
    )
    assert parse_l4t_release(orin) == "36.3.0"
    assert jetpack_for_l4t("36.3.0") == "6.0"
    assert jetpack_for_l4t("36.4.3") == "6.2" and jetpack_for_l4t("36.4.0") == "6.1"
    assert jetpack_for_l4t("35.4.1") == "5.1.2"
    assert jetpack_for_l4t("32.7.4") is None
    assert parse_l4t_release("not a release file") is None


def test_mps_is_found_by_its_control_fifo_where_cuda_clients_look_for_it(tmp_path: Path) -> None:
    """A real FIFO named control, as nvidia-cuda-mps-control -d makes it: found in
    CUDA_MPS_PIPE_DIRECTORY; a plain file or an empty directory is no daemon."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert mps_pipe_dir(env) is None
    (tmp_path / "control").write_text("")
    assert mps_pipe_dir(env) is None
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert mps_pipe_dir(env) == tmp_path


def test_doctor_says_when_several_workers_take_turns_on_a_gpu_without_mps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    doc = Doctor(make_config({"server": {"workers": 4}}), DoctorOptions(), out=lambda _: None)
    assert doc.check_gpu_sharing().status == NA  # no GPU found (yet): nothing to say
    doc._gpu = "a GPU (stand-in: this machine has none)"
    alone = doc.check_gpu_sharing()
    assert alone.details["workers"] == 4 and "take turns" in alone.summary
    assert "deploy/systemd/nvidia-mps.service" in alone.summary
    os.mkfifo(tmp_path / "control")
    shared = doc.check_gpu_sharing()
    assert "MPS is running" in shared.summary
    assert shared.details["mps_pipe_directory"] == str(tmp_path)


def test_relative_error_is_the_norm_of_the_difference_over_the_reference() -> None:
    ref = np.array([3.0, 4.0], np.float32)
    assert relative_error(ref, ref) == 0.0
    assert relative_error(ref + np.array([0.3, 0.4], np.float32), ref) == pytest.approx(0.1)


def test_a_check_that_breaks_is_one_fail_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    doc = Doctor(make_config(), DoctorOptions(seconds=0.1), out=lines.append)

    def broken() -> Any:
        raise KeyError("no such field")

    monkeypatch.setattr(doc, "check_jetson", broken)
    monkeypatch.setattr(doc, "check_onnxruntime", broken)
    monkeypatch.setattr(doc, "check_engines", lambda: [])
    monkeypatch.setattr(doc, "check_latency", lambda: [])
    checks = {c.name: c for c in doc.run()}
    broke = checks["jetpack / l4t"]
    assert broke.status == FAIL and broke.summary == "KeyError: 'no such field'"
    assert any(line.startswith("FAIL  jetpack / l4t") for line in lines)
    assert checks["platform"].status == "info"  # the others still ran


@pytest.fixture
def mock_gpu(
    mock_trt: tuple[MockState, types.ModuleType],  # noqa: F811 - the imported fixture
    monkeypatch: pytest.MonkeyPatch,
) -> MockState:
    """The mock TensorRT and CUDA layer, also where doctor probes the layers (as one)."""
    state, _ = mock_trt
    monkeypatch.setattr(
        "edge_vision.engines.cuda.open_runtime", lambda *a, **k: MockCudaRuntime(state)
    )
    monkeypatch.setattr(
        "edge_vision.engines.cuda.base._BACKENDS", {"cuda-python": ("mock", "Mock")}
    )
    return state


def test_doctor_builds_a_plan_and_compares_tensorrt_with_onnxruntime_mock_tensorrt(
    mock_gpu: MockState, tmp_path: Path
) -> None:
    state = mock_gpu
    config = make_config(
        {
            "engine": {
                "kind": "tensorrt",
                "max_batch": 2,
                "in_flight": 1,
                "tensorrt": {"engine_dir": str(tmp_path / "engines")},
            }
        }
    )
    lines: list[str] = []
    before = Doctor(config, DoctorOptions(seconds=0.1), out=lines.append)
    assert before.check_tensorrt().summary == "TensorRT 10.3.0"
    assert before.check_dla().details["dla_cores"] == 2
    assert before.check_cuda_layers().status == PASS
    plan = before.check_plan()
    assert plan.details["lookup"] == "missing" and "doctor --build" in plan.summary
    (untested,) = before.check_engines()  # no plan, and doctor never builds one unasked
    assert untested.status == NA and "doctor --build" in untested.summary
    assert state.builds == []

    # Latency is measured in the CPU test above; here it would only time ONNX Runtime again.
    options = DoctorOptions(build=True, latency=False)
    built = Doctor(config, options, out=lines.append).run()
    by_name = {c.name: c for c in built}
    assert by_name["tensorrt plan"].status == PASS, by_name["tensorrt plan"]
    assert by_name["tensorrt plan"].summary.startswith("built ")
    assert len(state.builds) == 1
    compared = by_name["tensorrt vs onnxruntime (cuda-python)"]
    # The mock's "plan" runs the same graph with ONNX Runtime: the same answer.
    assert compared.status == PASS, compared
    assert compared.details["relative_error"] < 1e-3
    assert compared.details["agreement"]["recall"] == 1.0
    assert by_name["latency"].status == NA and "skipped" in by_name["latency"].summary
    assert not [c for c in built if c.status == FAIL], [c.line() for c in built]
    assert doctor_module.summary_table(built).splitlines()[-1].startswith("OK: ")
    assert len(state.builds) == 1  # the engine checks ran the plan --build made

    after = Doctor(config, DoctorOptions(), out=lines.append).check_plan()
    assert after.status == PASS and after.summary.endswith("matches " + plan.details["stem"])


def test_doctor_build_runs_the_int8_gate_and_prints_the_agreement_mock_tensorrt(
    mock_gpu: MockState, tmp_path: Path
) -> None:
    from ..support.video import write_image_folder

    write_image_folder(tmp_path / "frames", 480, 270, frames=6)
    tensorrt = {
        "engine_dir": str(tmp_path / "engines"),
        "precision": "int8",
        "calibration_source": str(tmp_path / "frames"),
        "calibration_frames": 4,
        "calibration_batch": 2,
        "int8_gate_frames": 2,
    }
    config = make_config({"engine": {"kind": "tensorrt", "max_batch": 2, "tensorrt": tensorrt}})
    plan = Doctor(config, DoctorOptions(build=True), out=lambda _: None).check_plan()
    assert plan.status == PASS, plan
    assert "INT8 accepted: agreement 1.000 (min 0.95)" in plan.summary
    assert plan.details["int8_gate"]["held_back"] is True
    again = Doctor(config, DoctorOptions(), out=lambda _: None).check_plan()
    assert "matches" in again.summary and "INT8 accepted" in again.summary


def test_doctor_reads_a_gpu_engine_s_byte_map_as_probabilities_made_on_the_cpu() -> None:
    """With engine.torch.device_post the torch engine on a GPU returns DB's byte map, not
    the float map; the doctor must compare it with ONNX Runtime's map made a byte map the
    same way (here by the same torch function on the CPU), so the byte map's rounding is
    not counted as the engine's error, while a wrong map still fails."""
    torch = pytest.importorskip(
        "torch", reason="torch is not installed here; the byte map is made by a torch function"
    )
    from edge_vision.model.device_post import db_map_bytes
    from edge_vision.tools.doctor import compare_with_reference

    rng = np.random.default_rng(3)
    prob = np.clip(rng.normal(0.1, 0.3, (1, 1, 64, 96)), 0, 1).astype(np.float32)
    dets = np.zeros((0, 6), np.float32)
    ref = {"raw": prob, "detections": dets}

    def engine_output(p: np.ndarray) -> dict[str, Any]:
        raw = db_map_bytes(torch, torch.from_numpy(p), 0.3).numpy()
        return {
            "raw": raw,
            "byte_map_threshold": 0.3,
            "detections": dets,
            "engine": {},
            "frame_ms": 1.0,
        }

    same = compare_with_reference("torch", engine_output(prob), ref, "fp32")
    assert same.details["relative_error"] == 0.0 and same.status == "pass", same.summary
    off = np.clip(prob + rng.normal(0, 0.05, prob.shape), 0, 1).astype(np.float32)
    wrong = compare_with_reference("torch", engine_output(off), ref, "fp16")
    assert wrong.details["relative_error"] > 1e-2 and wrong.status == "fail", wrong.summary


def test_doctor_judges_a_gpu_engine_s_yolo_nms_by_its_detections() -> None:
    """With engine.torch.device_post a YOLO v8 model is NMS'd on the GPU and its best
    1,024 anchors come back as boxes, not ONNX Runtime's 8,400 raw anchors: no
    element-wise error can be taken, so the doctor says so and passes or fails on the
    detections alone."""
    from edge_vision.tools.doctor import compare_with_reference

    dets = np.array([[10, 20, 110, 220, 0.9, 3], [300, 40, 380, 90, 0.8, 0]], np.float32)
    ref = {"raw": np.zeros((1, 84, 8400), np.float32), "detections": dets}

    def engine_output(found: np.ndarray) -> dict[str, Any]:
        raw = np.zeros((1, 1024, 6), np.float32)  # the first output: the candidates
        return {"raw": raw, "detections": found, "engine": {}, "frame_ms": 1.0}

    same = compare_with_reference("torch", engine_output(dets), ref, "fp16")
    assert same.status == "pass" and same.details["relative_error"] is None, same.summary
    assert "NMS on the device, best 1024 anchors of 8400 back" in same.summary
    missed = compare_with_reference("torch", engine_output(dets[:1]), ref, "fp16")
    assert missed.status == "fail", missed.summary


def test_doctor_says_whether_the_torch_engine_s_graph_was_compiled() -> None:
    """engine.torch.compile: doctor's torch line says how many warm-up shapes inductor
    compiled on this board, and fails when none did (the engine then runs its interpreter:
    on a Jetson, a torch without Triton for the board)."""
    from edge_vision.tools.doctor import compare_with_reference

    dets = np.array([[10, 20, 110, 220, 0.9, 0]], np.float32)
    prob = np.full((1, 1, 8, 8), 0.5, np.float32)
    ref = {"raw": prob, "detections": dets}

    def engine_output(engine: dict[str, Any]) -> dict[str, Any]:
        return {"raw": prob, "detections": dets, "engine": engine, "frame_ms": 1.0}

    plain = compare_with_reference("torch", engine_output({"compile": "off"}), ref, "fp16")
    assert plain.status == "pass" and "compile" not in plain.summary
    done = engine_output({"compile": "default", "compiled_shapes": 5})
    compiled = compare_with_reference("torch", done, ref, "fp16")
    assert compiled.status == "pass" and "torch compile default: 5 shape(s)" in compiled.summary
    failed = engine_output({"compile": "default", "compiled_shapes": 0})
    none = compare_with_reference("torch", failed, ref, "fp16")
    assert none.status == "fail" and "runs its interpreter" in none.summary
