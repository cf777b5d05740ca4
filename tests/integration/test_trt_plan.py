"""The TensorRT plan logic that needs no TensorRT: profile, key, lookup, JSON record,
calibration input, the ONNX input adapter, parser-error messages, build progress.

All of it runs on this CPU machine for real (files, ONNX Runtime, OpenCV); TensorRT itself
is absent here, so nothing in this file pretends to call it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge_vision.engines import tensorrt as plan
from edge_vision.errors import ConfigError, EngineError, ModelError
from edge_vision.model.shape import (
    InputLimits,
    Normalisation,
    choose_input_shape,
    letterbox_into,
    normalise_into,
    plan_for_frame,
    plan_letterbox,
    side_range,
)
from edge_vision.model.spec import ModelSpec

from ..support.video import read_video, write_image_folder, write_text_clip

# The default model's: target 640, stride 32, sides 32..1280, stretched as PP-OCR's own
# pre-processing does (models.PRESET_FIT, model.fit: preset).
LIMITS = InputLimits(fit="stretch")
LETTERBOX = InputLimits(fit="letterbox")
ADAPTER = plan.InputAdapter("NHWC uint8 BGR", (127.5,) * 3, (127.5,) * 3, False)


def make_key(**changes: object) -> plan.PlanKey:
    key = plan.PlanKey(
        model_name="PP-OCRv6_det_small",
        model_sha256="ab" * 32,
        tensorrt_version="10.3.0",
        gpu_name="Orin",
        compute_capability=(8, 7),
        precision="fp16",
        profile=plan.derive_profile(LIMITS, 4),
        dla_core=None,
        adapter=ADAPTER,
    )
    return dataclasses.replace(key, **changes)  # type: ignore[arg-type]


# -- the optimisation profile --------------------------------------------------------------


def test_every_shape_the_server_picks_lies_inside_the_derived_profile() -> None:
    for limits in (
        LIMITS,
        LETTERBOX,
        InputLimits(960, 32, 320, 960),
        InputLimits(640, 64, 100, 1000, "stretch"),
    ):
        profile = plan.derive_profile(limits, 8)
        sizes = [
            (w, h) for w in (1, 17, 320, 640, 1279, 1920, 4000) for h in (1, 33, 480, 1080, 3000)
        ]
        for w, h in sizes:
            ih, iw = choose_input_shape(w, h, limits)
            profile.check(8, ih, iw)  # raises when outside
        lo, hi = side_range(limits)
        seen = {choose_input_shape(w, h, limits) for w, h in sizes}
        assert min(min(s) for s in seen) == lo and max(max(s) for s in seen) == hi


def test_default_profile_spans_batch_one_to_max_and_is_tuned_for_a_16_9_frame(
    spec: ModelSpec,
) -> None:
    assert spec.limits == LIMITS  # the default config's model, as serving loads it
    profile = plan.derive_profile(LIMITS, 4)
    # Sides stop at the target (640): no frame is ever scaled past it, whatever max_side says.
    # OPT is what serving picks for a 16:9 frame: 1080 * 640/1920 = 360 rounded to the
    # nearest multiple of 32 (stretch) is 352; a letterbox rounds up, to 384.
    assert profile.shapes() == ((1, 32, 32, 3), (4, 352, 640, 3), (4, 640, 640, 3))
    assert choose_input_shape(1280, 720, LIMITS) == (352, 640)
    boxed = plan.derive_profile(LETTERBOX, 4)
    assert boxed.shapes() == ((1, 32, 32, 3), (4, 384, 640, 3), (4, 640, 640, 3))
    tuned = plan.derive_profile(LIMITS, 4, opt_batch=1, opt_shape=(640, 384))
    assert tuned.shapes()[1] == (1, 640, 384, 3)


@pytest.mark.parametrize(
    ("opt_batch", "opt_shape", "words"),
    [
        (5, None, "opt_batch must lie in 1..engine.max_batch (4)"),
        (None, (384, 650), "opt_shape width 650 must be a multiple of 32"),
        (None, (704, 640), "opt_shape height 704 must be a multiple of 32 within 32..640"),
    ],
)
def test_an_opt_point_outside_the_profile_is_refused_naming_the_key(
    opt_batch: int | None, opt_shape: tuple[int, int] | None, words: str
) -> None:
    with pytest.raises(ConfigError, match=r"engine\.tensorrt\.opt_") as e:
        plan.derive_profile(LIMITS, 4, opt_batch=opt_batch, opt_shape=opt_shape)
    assert words in str(e.value)


def test_dla_needs_static_sides_and_gets_a_fixed_batch_padded_at_run_time() -> None:
    with pytest.raises(ConfigError, match=r"model.min_side/max_side allow 32..640"):
        plan.derive_profile(LIMITS, 4, dla=True)
    static = InputLimits(640, 32, 640, 640)
    profile = plan.derive_profile(static, 2, dla=True)
    assert profile.static and profile.shapes()[0] == profile.shapes()[2] == (2, 640, 640, 3)
    assert choose_input_shape(1920, 1080, static) == (640, 640)  # every frame fits it
    assert profile.run_batch(1) == 2  # one frame runs padded to the fixed batch
    profile.check(1, 640, 640)


def test_a_batch_outside_the_profile_is_an_engine_error_that_says_rebuild() -> None:
    profile = plan.derive_profile(LIMITS, 4)
    with pytest.raises(EngineError, match=r"outside the TensorRT profile.*rebuild"):
        profile.check(5, 384, 640)
    with pytest.raises(EngineError, match="at 640x704"):
        profile.check(1, 704, 640)


def test_calibration_runs_at_the_profile_opt_sides_with_a_batch_the_profile_allows() -> None:
    profile = plan.derive_profile(LIMITS, 4)
    assert plan.calibration_shape(profile, 8) == (4, 352, 640)
    assert plan.calibration_shape(profile, 2) == (2, 352, 640)
    boxed = plan.derive_profile(LETTERBOX, 4)
    assert plan.calibration_shape(boxed, 8) == (4, 384, 640)
    dla = plan.derive_profile(InputLimits(640, 32, 640, 640), 2, dla=True)
    assert plan.calibration_shape(dla, 1) == (2, 640, 640)


# -- the key --------------------------------------------------------------------------------


def test_the_key_changes_with_everything_a_plan_depends_on_and_nothing_else() -> None:
    base = make_key()
    assert make_key().digest == base.digest and make_key().stem == base.stem
    variants = {
        "model": make_key(model_sha256="cd" * 32),
        "tensorrt": make_key(tensorrt_version="10.7.0"),
        "gpu": make_key(gpu_name="NVIDIA H200"),
        "compute capability": make_key(compute_capability=(8, 6)),
        "precision": make_key(precision="int8"),
        "profile": make_key(profile=plan.derive_profile(LIMITS, 4, opt_batch=1)),
        "dla": make_key(
            dla_core=0, profile=plan.derive_profile(InputLimits(640, 32, 640, 640), 4, dla=True)
        ),
        "input adapter": make_key(adapter=dataclasses.replace(ADAPTER, rgb=True)),
    }
    digests = {name: k.digest for name, k in variants.items()}
    assert base.digest not in digests.values()
    assert len(set(digests.values())) == len(digests)


def test_plan_file_names_read_as_what_they_are() -> None:
    key = make_key(gpu_name="NVIDIA H200", compute_capability=(9, 0), tensorrt_version="10.13.3")
    assert key.stem == f"pp-ocrv6-det-small-fp16-nvidia-h200-sm90-trt10-13-3-{key.digest}"
    assert make_key(dla_core=1).stem.endswith(f"-dla1-{make_key(dla_core=1).digest}")
    plan_path, json_path = plan.plan_paths(Path("engines"), key)
    assert (plan_path.suffix, json_path.suffix) == (".plan", ".json")
    assert key.machine() == "NVIDIA H200 (sm_90)/TensorRT 10.13.3"


def test_timing_cache_is_one_per_gpu_and_tensorrt_version_unless_configured() -> None:
    orin = plan.timing_cache_path(Path("e"), make_key())
    assert orin == Path("e/timing-orin-sm_87-trt10-3-0.cache")
    assert plan.timing_cache_path(Path("e"), make_key(precision="int8")) == orin  # shared
    assert plan.timing_cache_path(Path("e"), make_key(tensorrt_version="10.7")) != orin
    assert plan.timing_cache_path(Path("e"), make_key(), Path("/x.cache")) == Path("/x.cache")


def test_calibration_cache_is_shared_across_gpus_and_profiles_not_across_frames(
    tmp_path: Path,
) -> None:
    shape = (4, 384, 640)
    a = plan.calibration_cache_path(tmp_path, make_key(), tmp_path / "frames", 256, shape)
    gpu = make_key(gpu_name="NVIDIA H200", profile=plan.derive_profile(LIMITS, 8))
    assert plan.calibration_cache_path(tmp_path, gpu, tmp_path / "frames", 256, shape) == a
    assert plan.calibration_cache_path(tmp_path, make_key(), tmp_path / "other", 256, shape) != a
    assert plan.calibration_cache_path(tmp_path, make_key(), tmp_path / "frames", 64, shape) != a
    # A stretched frame is another picture than a letterboxed one: another cache.
    stretched = plan.calibration_cache_path(
        tmp_path, make_key(), tmp_path / "frames", 256, shape, "stretch"
    )
    assert stretched != a


# -- lookup, record, atomic writes ----------------------------------------------------------


def write(engine_dir: Path, key: plan.PlanKey, data: bytes = b"PLAN" * 100) -> plan.PlanRecord:
    record = plan.make_record(
        key,
        Path("/models/m.onnx"),
        data,
        build_seconds=12.5,
        workspace_mib=2048,
        timing_cache=engine_dir / "t.cache",
        calibration=None,
        edge_vision_version="0.1.0",
    )
    plan.write_plan_atomically(engine_dir, key, data, record)
    return record


def test_a_written_plan_is_found_by_its_key_with_a_record_of_how_it_was_built(
    tmp_path: Path,
) -> None:
    key = make_key()
    assert plan.lookup_plan(tmp_path / "engines", key).status == "missing"
    write(tmp_path / "engines", key)
    found = plan.lookup_plan(tmp_path / "engines", key)
    assert found.status == "found" and found.plan_path.read_bytes() == b"PLAN" * 100
    data = json.loads(found.json_path.read_text())
    assert data["key"] == key.digest and data["plan_file"] == found.plan_path.name
    assert data["fields"]["tensorrt_version"] == "10.3.0"
    assert data["fields"]["gpu_name"] == "Orin" and data["fields"]["compute_capability"] == "8.7"
    assert data["fields"]["profile"]["max"] == [4, 640, 640, 3]
    assert data["build_seconds"] == 12.5 and data["plan_bytes"] == 400
    assert [p.name for p in (tmp_path / "engines").iterdir() if ".tmp" in p.name] == []


def test_a_plan_whose_bytes_or_record_were_changed_is_damaged_not_used(tmp_path: Path) -> None:
    key = make_key()
    write(tmp_path, key)
    plan_path, json_path = plan.plan_paths(tmp_path, key)
    plan_path.write_bytes(b"PLAN" * 99 + b"XXXX")
    damaged = plan.lookup_plan(tmp_path, key)
    assert damaged.status == "damaged" and "differs from the plan its record describes" in str(
        damaged.problem
    )
    write(tmp_path, key)
    json_path.write_text("{not json")
    assert plan.lookup_plan(tmp_path, key).status == "damaged"
    write(tmp_path, key)
    plan_path.unlink()
    assert "is missing" in str(plan.lookup_plan(tmp_path, key).problem)


def test_the_record_is_written_last_so_a_crash_mid_write_leaves_no_usable_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = make_key()
    real_replace = os.replace

    def crash_on_json(src: str | Path, dst: str | Path) -> None:
        if str(dst).endswith(".json"):
            raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_json)
    with pytest.raises(OSError, match="power cut"):
        write(tmp_path, key)
    monkeypatch.undo()
    assert plan.lookup_plan(tmp_path, key).status == "missing"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key.stem}.plan"]  # no tmp left


def test_a_plan_for_another_machine_is_refused_with_what_differs_and_how_to_rebuild(
    tmp_path: Path,
) -> None:
    old = make_key()  # Orin, TensorRT 10.3.0
    write(tmp_path, old)
    now = make_key(gpu_name="NVIDIA H200", compute_capability=(9, 0), tensorrt_version="10.13.3")
    found = plan.lookup_plan(tmp_path, now)
    assert found.status == "missing" and [r.key for r in found.others] == [old.digest]
    message = plan.refusal_message(found.others[0], now, Path("/models/m.onnx"))
    assert "plan built for Orin (sm_87)/TensorRT 10.3.0" in message
    assert "this machine is NVIDIA H200 (sm_90)/TensorRT 10.13.3" in message
    assert "rebuild with edge-vision build-engine /models/m.onnx --precision fp16" in message


def test_a_config_change_names_the_setting_that_changed(tmp_path: Path) -> None:
    old = make_key()
    record = write(tmp_path, old)
    diffs = plan.explain_stale(record, make_key(precision="int8"))
    assert diffs == ["precision 'fp16' → 'int8'"]
    diffs = plan.explain_stale(record, make_key(model_sha256="cd" * 32))
    assert diffs[0].startswith("model file changed")
    message = plan.refusal_message(record, make_key(precision="int8", dla_core=0), None)
    assert message.endswith(
        "rebuild with edge-vision build-engine --precision int8 --dla-core 0 "
        "(with the same --config as serve)"
    )


def test_records_of_other_models_are_not_offered_as_explanations(tmp_path: Path) -> None:
    write(tmp_path, make_key(model_name="yolo11n", model_sha256="ef" * 32))
    assert plan.lookup_plan(tmp_path, make_key()).others == []


def test_record_json_round_trips_and_foreign_json_is_refused() -> None:
    record = plan.make_record(
        make_key(),
        Path("m.onnx"),
        b"x",
        build_seconds=1.0,
        workspace_mib=64,
        timing_cache=None,
        calibration={"source": "frames/", "frames_used": 256},
        edge_vision_version="0.1.0",
    )
    assert plan.PlanRecord.from_json(record.to_json()) == record
    with pytest.raises(ValueError, match="not a plan record"):
        plan.PlanRecord.from_json(json.dumps({"record_format": 99}))
    with pytest.raises(ValueError, match="not JSON"):
        plan.PlanRecord.from_json("{")


def test_the_build_lock_excludes_other_builders_of_the_same_key_only(tmp_path: Path) -> None:
    key = make_key()
    lock_file = tmp_path / f".{key.stem}.lock"
    with plan.build_lock(tmp_path, key):
        # Another process (flock locks belong to open files) cannot take it meanwhile.
        probe = (
            "import fcntl, sys\n"
            "f = open(sys.argv[1], 'a')\n"
            "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "except BlockingIOError:\n    sys.exit(3)\n"
        )
        held = subprocess.run([sys.executable, "-c", probe, str(lock_file)], check=False)
        assert held.returncode == 3
        with plan.build_lock(tmp_path, make_key(precision="int8")):
            pass  # another key's lock is independent
    with lock_file.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released afterwards


# -- calibration input ----------------------------------------------------------------------


def counted(frames: list[np.ndarray], seen: list[int]) -> Iterator[np.ndarray]:
    for i, f in enumerate(frames):
        seen.append(i)
        yield f


def test_calibration_batches_are_full_batches_and_read_no_frame_more_than_needed() -> None:
    frames = [np.full((4, 6, 3), i, np.uint8) for i in range(20)]
    seen: list[int] = []
    batches = list(plan.calibration_batches(counted(frames, seen), batch_size=8, limit=20))
    assert [b.shape for b in batches] == [(8, 4, 6, 3), (8, 4, 6, 3)]
    assert [int(b[0, 0, 0, 0]) for b in batches] == [0, 8]  # frames in order
    assert seen == list(range(16))  # the partial third batch is never read
    assert list(plan.calibration_batches(iter(frames), batch_size=8, limit=7)) == []
    short = list(plan.calibration_batches(iter(frames[:10]), batch_size=8, limit=64))
    assert len(short) == 1
    with pytest.raises(ValueError, match="calibration frame 2"):
        list(plan.calibration_batches(iter([frames[0], np.zeros((5, 6, 3), np.uint8)]), 2, 4))


def letterboxed(img: np.ndarray, h: int, w: int, pad: int) -> np.ndarray:
    out = np.empty((h, w, 3), np.uint8)
    letterbox_into(img, plan_letterbox(img.shape[1], img.shape[0], h, w), out, pad)
    return out


def test_calibration_frames_from_an_image_folder_are_fitted_as_serving_does(
    tmp_path: Path,
) -> None:
    import cv2

    write_image_folder(tmp_path / "frames", 480, 270, frames=6)
    first = cv2.imread(str(tmp_path / "frames" / "frame_0.png"))
    got = list(plan.calibration_frames(tmp_path / "frames", 384, 640, 0, 4, fit="letterbox"))
    assert len(got) == 4 and all(g.shape == (384, 640, 3) for g in got)
    np.testing.assert_array_equal(got[0], letterboxed(first, 384, 640, 0))
    # The default model stretches: the frame fills the whole input, as serving's plan says.
    got = list(plan.calibration_frames(tmp_path / "frames", 352, 640, 0, 4, fit="stretch"))
    assert len(got) == 4 and all(g.shape == (352, 640, 3) for g in got)
    served = plan_for_frame(480, 270, dataclasses.replace(LIMITS, target=640))
    assert served.shape == (352, 640) and (served.pad_x, served.pad_y) == (0, 0)
    expected = np.empty((352, 640, 3), np.uint8)
    letterbox_into(first, served, expected, 0)
    np.testing.assert_array_equal(got[0], expected)
    assert not np.array_equal(got[0][:16], np.zeros_like(got[0][:16]))  # no padding rows


def test_calibration_frames_sample_a_long_video_evenly(tmp_path: Path) -> None:
    clip = write_text_clip(tmp_path / "clip.mp4", 640, 360, frames=48)
    frames, _ = read_video(clip.path)
    got = list(plan.calibration_frames(clip.path, 384, 640, 114, limit=12, fit="letterbox"))
    assert len(got) == 12
    for k, g in enumerate(got):  # every 4th frame: 0, 4, 8, ...
        np.testing.assert_array_equal(g, letterboxed(frames[4 * k], 384, 640, 114))


def test_a_missing_calibration_source_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"calibration_source.*no such file"):
        next(plan.calibration_frames(tmp_path / "nope", 352, 640, 0, 8, fit="stretch"))


def test_build_settings_tensorrt_would_reject_are_refused_first(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="DLA runs FP16 or INT8"):
        plan.validate_build_settings("fp32", 0, None)
    with pytest.raises(ConfigError, match="INT8 needs calibration frames"):
        plan.validate_build_settings("int8", None, None)
    plan.validate_build_settings("int8", 1, tmp_path)
    plan.validate_build_settings("fp16", None, None)


# -- the ONNX graph TensorRT builds from ----------------------------------------------------


@pytest.mark.parametrize("rgb", [False, True], ids=["bgr-model", "rgb-model"])
def test_the_uint8_input_adapter_computes_what_normalise_into_does(
    spec: ModelSpec, rgb: bool
) -> None:
    norm = Normalisation(spec.normalisation.mean, (120.0, 127.5, 135.0), rgb)
    original = onnx.load(str(spec.path))
    wrapped = plan.wrap_uint8_input(original, spec.input_name, norm)
    onnx.checker.check_model(wrapped)
    inputs = {i.name: i for i in wrapped.graph.input}
    assert list(inputs) == [plan.UINT8_INPUT_NAME]
    assert inputs[plan.UINT8_INPUT_NAME].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert [n.name for n in original.graph.input] == [spec.input_name]  # original untouched

    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 256, (384, 640, 3), dtype=np.uint8) for _ in range(2)]
    frames[1][:, :320] = (10, 120, 250)  # a BGR colour block, so channel order shows
    x = np.empty((2, 3, 384, 640), np.float32)
    normalise_into(x, frames, norm)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    ref_sess = ort.InferenceSession(original.SerializeToString(), opts, ["CPUExecutionProvider"])
    new_sess = ort.InferenceSession(wrapped.SerializeToString(), opts, ["CPUExecutionProvider"])
    ref = ref_sess.run(None, {spec.input_name: x})[0]
    got = new_sess.run(None, {plan.UINT8_INPUT_NAME: np.stack(frames)})[0]
    assert got.shape == ref.shape == (2, 1, 384, 640)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_the_recogniser_profile_is_nchw_at_height_48_from_the_nominal_width() -> None:
    profile = plan.recogniser_profile(6, 2560)
    assert profile.shapes() == ((1, 3, 48, 320), (6, 3, 48, 320), (6, 3, 48, 2560))
    assert profile.as_json()["max"] == [6, 3, 48, 2560]
    again = plan.ShapeProfile.from_shapes(*profile.shapes(), "NCHW")
    assert again == profile
    profile.check(6, 48, 2560)
    with pytest.raises(EngineError, match="outside the TensorRT profile"):
        profile.check(1, 48, 2592)
    with pytest.raises(EngineError, match="outside the TensorRT profile"):
        profile.check(7, 48, 320)
    with pytest.raises(ConfigError, match=r"read\.max_width must be >= 320"):
        plan.recogniser_profile(6, 300)
    # Another key than the detector's: the layout shows in the profile's shapes.
    det = make_key()
    rec = dataclasses.replace(det, profile=profile)
    assert rec.digest != det.digest and rec.fields()["profile"]["opt"] == [6, 3, 48, 320]


def test_the_recogniser_graph_with_its_arg_max_gives_what_onnx_runtime_s_recogniser_does() -> None:
    from benchmarks.read import _sample_crops
    from edge_vision.engines.recognisers import OnnxRuntimeRecogniser
    from edge_vision.frames.read import recogniser_batches
    from edge_vision.model.spec import default_recogniser_path

    path = default_recogniser_path()
    original = onnx.load(str(path))
    wrapped = plan.append_argmax(original)
    onnx.checker.check_model(wrapped)
    assert [o.name for o in wrapped.graph.output] == [plan.ARGMAX_OUTPUT, plan.MAX_OUTPUT]
    assert len(original.graph.output) == 1  # original untouched
    x = recogniser_batches(_sample_crops(np.random.default_rng(1), 4), 6)[0][1]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(wrapped.SerializeToString(), opts, ["CPUExecutionProvider"])
    idx, best = sess.run(None, {"x": x})
    assert idx.dtype == np.int32 and best.dtype == np.float32
    want_idx, want_best = OnnxRuntimeRecogniser(path, threads=2).run(x)
    assert idx.shape == want_idx.shape == (4, x.shape[3] // 8)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_allclose(best, want_best, rtol=1e-6)


def test_the_adapter_keeps_static_dims_and_refuses_a_missing_input(spec: ModelSpec) -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("Identity", ["images"], ["out"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 640, 640])],
    )
    model = helper.make_model(graph)
    wrapped = plan.wrap_uint8_input(model, "images", spec.normalisation)
    dims = [d.dim_value for d in wrapped.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 640, 640, 3]
    assert len(wrapped.graph.node) == 1 + plan.adapter_node_count(spec.normalisation)
    with pytest.raises(ModelError, match="no input named 'x'"):
        plan.wrap_uint8_input(model, "x", spec.normalisation)


def test_parser_errors_name_the_failing_nodes_of_the_users_model() -> None:
    errors = [
        plan.ParserErrorInfo(
            "UNSUPPORTED_NODE",
            "no importer for op",
            7,
            "/head/NonMaxSuppression",
            "NonMaxSuppression",
        ),
        plan.ParserErrorInfo("INVALID_NODE", "bad cast", 0, plan.ADAPTER_PREFIX + "cast", "Cast"),
        plan.ParserErrorInfo("INVALID_GRAPH", "opset 23 unsupported", -1, "", ""),
    ]
    text = plan.describe_parser_errors(Path("m.onnx"), errors, adapter_nodes=4)
    assert text.splitlines() == [
        "TensorRT's ONNX parser rejected m.onnx (3 error(s)):",
        "  node '/head/NonMaxSuppression' (NonMaxSuppression, #3): UNSUPPORTED_NODE: "
        "no importer for op",
        "  edge_vision input adapter node 'edge_vision_pre/cast' (Cast): INVALID_NODE: bad cast",
        "  model: INVALID_GRAPH: opset 23 unsupported",
    ]


# -- build progress -------------------------------------------------------------------------


def test_build_progress_logs_phases_and_can_cancel_the_build(
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = plan.LogBuildProgress(interval_s=0.0, notify=False)
    with caplog.at_level(logging.INFO, logger="edge_vision.engines.tensorrt.progress"):
        progress.phase_start("Building engine", None, 4)
        progress.phase_start("Tactic timing", "Building engine", 10)
        assert progress.step_complete("Tactic timing", 2) is True
        assert progress.describe() == "Building engine 0/4 > Tactic timing 3/10"
        progress.phase_finish("Tactic timing")
        progress.cancel()
        assert progress.step_complete("Building engine", 0) is False  # TensorRT stops
        progress.phase_finish("Building engine")
    text = caplog.text
    assert "TensorRT build: Building engine (4 steps)" in text
    assert "Building engine 0/4 > Tactic timing 3/10" in text
    assert "Building engine done in" in text


def test_build_progress_extends_the_systemd_start_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket
    import tempfile

    # A real notify socket, as systemd provides; a short path (AF_UNIX allows ~107 bytes).
    with tempfile.TemporaryDirectory(prefix="ev-") as folder:
        addr = str(Path(folder) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(addr)
            monkeypatch.setenv("NOTIFY_SOCKET", addr)
            progress = plan.LogBuildProgress(interval_s=0.0)
            progress.phase_start("Building engine", None, 2)
            message = sock.recv(4096).decode()
    assert "EXTEND_TIMEOUT_USEC=" in message
    assert "STATUS=building TensorRT plan: Building engine (2 steps)" in message


def test_build_engine_refuses_dla_with_dynamic_sides_before_opening_tensorrt(
    tmp_path: Path,
) -> None:
    # TensorRT is absent here, so reaching it would print its import error instead.
    cmd = [sys.executable, "-m", "edge_vision", "build-engine", "--dla-core", "0"]
    env = {**os.environ, "EDGE_VISION_ENGINE__TENSORRT__ENGINE_DIR": str(tmp_path)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=120)
    assert done.returncode == 2
    assert "a DLA plan needs static input shapes" in done.stderr
    fp32 = subprocess.run(
        [*cmd, "--precision", "fp32"], capture_output=True, text=True, env=env, timeout=120
    )
    assert fp32.returncode == 2 and "DLA runs FP16 or INT8" in fp32.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_jetson_config_is_valid_and_serves_tensorrt_with_the_cpu_fallback() -> None:
    from edge_vision.config import load_config

    repo = Path(__file__).resolve().parents[2]
    config = load_config(repo / "jetson" / "config.yaml", environ={})
    assert config.engine.kind == "tensorrt" and config.engine.fallback == "onnxruntime"
    assert config.engine.tensorrt.engine_dir == Path("/var/lib/edge-vision/engines")
    unit = (repo / "jetson" / "edge-vision.service").read_text()
    for line in ("Type=notify", "WatchdogSec=30", "Restart=on-failure"):
        assert f"\n{line}\n" in unit
    assert "EDGE_VISION_CONFIG=/etc/edge-vision/config.yaml" in unit
