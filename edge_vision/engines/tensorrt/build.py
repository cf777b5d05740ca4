"""Building a plan: parse the input-adapted ONNX model, build, cache; find or build once.

Every TensorRT build call of edge_vision is here (written against the TensorRT 10 Python
API as NVIDIA's samples use it: ``build_serialized_network`` with an optimisation profile,
FP16/INT8 (``IInt8EntropyCalibrator2``), a timing cache, ``IProgressMonitor`` and DLA
(``DeviceType.DLA`` + ``BuilderFlag.GPU_FALLBACK``)); what surrounds the calls is in
:mod:`.profile`, :mod:`.plan_store`, :mod:`.onnx_adapter`, :mod:`.calibration` and
:mod:`.progress`. Not run against a real TensorRT here:
tests/integration/test_tensorrt_plans_mocked.py
drives it with a fake module.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ... import __version__
from ...config import Config
from ...errors import ConfigError, EdgeVisionError, EngineError, ModelError
from ...model.spec import ModelSpec, decide_max_batch
from ..cuda import CudaRuntime, open_runtime
from . import int8_gate
from .calibration import calibration_batches, calibration_frames, entropy_calibrator
from .library import SINK, import_tensorrt, trt_logger
from .onnx_adapter import (
    UINT8_INPUT_NAME,
    ParserErrorInfo,
    adapter_node_count,
    describe_parser_errors,
    wrap_uint8_input,
)
from .plan_store import (
    InputAdapter,
    PlanKey,
    PlanRecord,
    build_lock,
    calibration_cache_path,
    lookup_plan,
    make_record,
    rebuild_command,
    refusal_message,
    timing_cache_path,
    write_cache_atomically,
    write_plan_atomically,
)
from .profile import calibration_shape, profile_for
from .progress import BuildProgress, progress_monitor

log = logging.getLogger(__name__)

INPUT = UINT8_INPUT_NAME
#: Plans whose build failed in this process, by key digest: not built again until a
#: forced build (``build-engine --force``) or a restart.
_BUILD_FAILURES: dict[str, str] = {}


def validate_build_settings(
    precision: str, dla_core: int | None, calibration_source: Path | None
) -> None:
    """Settings TensorRT would reject late (after parsing) or silently ignore, refused early."""
    if dla_core is not None and precision == "fp32":
        raise ConfigError(
            "DLA runs FP16 or INT8 layers only: use precision fp16 or int8 with --dla-core"
        )
    if precision == "int8" and calibration_source is None:
        raise ConfigError(
            "INT8 needs calibration frames: set engine.tensorrt.calibration_source (or "
            "--calibration) to an image folder or a video of the scenes the camera sees"
        )


# ---------------------------------------------------------------------------------------
# Building


def current_key(trt: Any, rt: CudaRuntime, spec: ModelSpec, config: Config) -> PlanKey:
    """The key of the plan this model, config, GPU and TensorRT want."""
    tcfg = config.engine.tensorrt
    profile = profile_for(spec.limits, decide_max_batch(spec, config.engine), tcfg)
    return PlanKey(
        model_name=spec.name,
        model_sha256=spec.sha256,
        tensorrt_version=str(trt.__version__),
        gpu_name=rt.device_name(),
        compute_capability=rt.compute_capability(),
        precision=tcfg.precision,
        profile=profile,
        dla_core=tcfg.dla_core,
        adapter=InputAdapter.for_normalisation(spec.normalisation),
    )


def _wrapped_model_bytes(spec: ModelSpec) -> bytes:
    import onnx

    try:
        model = onnx.load(str(spec.path))
    except Exception as e:  # onnx raises DecodeError and friends without a common base
        raise ModelError(f"{spec.path} is not a readable ONNX model: {e}") from e
    wrapped = wrap_uint8_input(model, spec.input_name, spec.normalisation)
    try:
        data: bytes = wrapped.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        raise ModelError(f"{spec.path} is too large to hand to TensorRT's parser: {e}") from e
    return data


def _parser_errors(parser: Any) -> list[ParserErrorInfo]:
    """``IParserError``s as plain values (TensorRT 10: ``node_name``/``node_operator``)."""
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        errors.append(
            ParserErrorInfo(
                code=str(e.code()),
                desc=str(e.desc()),
                node_index=int(e.node()),
                node_name=str(e.node_name() or ""),
                node_operator=str(e.node_operator() or ""),
                file=str(e.file() or ""),
                line=int(e.line()),
                func=str(e.func() or ""),
            )
        )
    return errors


def parse_network(
    trt: Any, model_bytes: bytes, path: Path, adapter_nodes: int, input_name: str
) -> tuple[Any, Any, Any]:
    """``(builder, network, parser)`` with ``model_bytes`` parsed; EngineError naming the
    failing nodes when the parser rejects it, or when its one input is not ``input_name``.
    The parser is returned because the network refers to weights it holds."""
    logger = trt_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    # ``path`` lets the parser find external weights next to the original model file.
    if not parser.parse(model_bytes, str(path)):
        raise EngineError(describe_parser_errors(path, _parser_errors(parser), adapter_nodes))
    if network.num_inputs != 1 or network.get_input(0).name != input_name:
        raise EngineError(f"the parsed network's input is not {input_name!r}; cannot build {path}")
    return builder, network, parser


def builder_config(
    trt: Any, builder: Any, key: PlanKey, input_name: str, workspace_mib: int
) -> Any:
    """A builder config with the workspace limit and ``key``'s optimisation profile."""
    bconfig = builder.create_builder_config()
    bconfig.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    profile = builder.create_optimization_profile()
    lo, opt, hi = key.profile.shapes()
    profile.set_shape(input_name, lo, opt, hi)
    if bconfig.add_optimization_profile(profile) < 0:
        raise EngineError(f"TensorRT refused the optimisation profile {key.profile.as_json()}")
    return bconfig


def use_timing_cache(bconfig: Any, cache_path: Path) -> Path:
    """Give the build the timing cache at ``cache_path`` (a new one when it is missing or
    was made on another device or version); returns the path to save it to."""
    cache_bytes = cache_path.read_bytes() if cache_path.is_file() else b""
    timing_cache = bconfig.create_timing_cache(cache_bytes)
    if timing_cache is None or not bconfig.set_timing_cache(timing_cache, False):
        log.warning(
            "timing cache %s was made on another device or version; starting anew", cache_path
        )
        timing_cache = bconfig.create_timing_cache(b"")
        bconfig.set_timing_cache(timing_cache, False)
    elif cache_bytes:
        log.info("reusing timing cache %s", cache_path)
    return cache_path


def save_timing_cache(bconfig: Any, cache_path: Path) -> None:
    built = bconfig.get_timing_cache()
    if built is not None:
        write_cache_atomically(cache_path, memoryview(built.serialize()).tobytes())


@dataclass
class BuildResult:
    plan: bytes
    seconds: float
    timing_cache: Path
    calibration: dict[str, Any] | None


def build_plan(
    trt: Any,
    rt: CudaRuntime,
    spec: ModelSpec,
    config: Config,
    key: PlanKey,
    progress: BuildProgress,
    on_calibration_frames: Callable[[int], None] | None = None,
) -> BuildResult:
    """Parse the (input-adapted) ONNX model and build a serialized plan for ``key``.

    Blocking, minutes long: call it from a worker thread (or the CLI's main thread).
    """
    tcfg = config.engine.tensorrt
    validate_build_settings(tcfg.precision, tcfg.dla_core, tcfg.calibration_source)
    mark = SINK.mark()
    t0 = time.perf_counter()
    rt.bind_thread()
    model_bytes = _wrapped_model_bytes(spec)
    adapter_nodes = adapter_node_count(spec.normalisation)
    builder, network, _parser = parse_network(trt, model_bytes, spec.path, adapter_nodes, INPUT)
    bconfig = builder_config(trt, builder, key, INPUT, tcfg.workspace_mib)

    if tcfg.precision in ("fp16", "int8"):
        # INT8 plans keep FP16 allowed so layers without INT8 kernels run in FP16, not FP32.
        bconfig.set_flag(trt.BuilderFlag.FP16)
    if key.dla_core is not None:
        available = int(builder.num_DLA_cores)
        if key.dla_core >= available:
            raise EngineError(
                f"DLA core {key.dla_core} requested; this device has {available} DLA core(s)"
            )
        bconfig.default_device_type = trt.DeviceType.DLA
        bconfig.DLA_core = key.dla_core
        # Layers DLA cannot run (and the uint8 input adapter) run on the GPU instead.
        bconfig.set_flag(trt.BuilderFlag.GPU_FALLBACK)

    cache_path = use_timing_cache(
        bconfig, timing_cache_path(tcfg.engine_dir, key, tcfg.timing_cache)
    )
    monitor = progress_monitor(trt, progress)
    bconfig.progress_monitor = monitor

    calibrator = None
    calibration: dict[str, Any] | None = None
    if tcfg.precision == "int8":
        source = tcfg.calibration_source
        if source is None:  # validate_build_settings refused this already
            raise EngineError("INT8 needs engine.tensorrt.calibration_source")
        cb, ch, cw = calibration_shape(key.profile, tcfg.calibration_batch)
        calib_cache = calibration_cache_path(
            tcfg.engine_dir, key, source, tcfg.calibration_frames, (cb, ch, cw), spec.limits.fit
        )
        batches: Iterator[np.ndarray] = iter(())
        if not calib_cache.is_file():  # with a cache TensorRT asks for no frames
            frames = calibration_frames(
                source, ch, cw, spec.pad_value, tcfg.calibration_frames, fit=spec.limits.fit
            )
            batches = calibration_batches(frames, cb, tcfg.calibration_frames)
        calibrator = entropy_calibrator(
            trt, rt, batches, (cb, ch, cw), calib_cache, on_calibration_frames
        )
        calibration_profile = builder.create_optimization_profile()
        fixed = (cb, ch, cw, 3)
        calibration_profile.set_shape(INPUT, fixed, fixed, fixed)
        # Implicit INT8 calibration is deprecated since TensorRT 10.1 in favour of explicit
        # quantization (Q/DQ nodes from NVIDIA's Model Optimizer) but still supported, and it
        # is what JetPack 6's TensorRT 10.3 users have; the warnings say nothing new here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            bconfig.set_flag(trt.BuilderFlag.INT8)
            bconfig.set_calibration_profile(calibration_profile)
            bconfig.int8_calibrator = calibrator
        calibration = {
            "source": str(source),
            "frames_requested": tcfg.calibration_frames,
            "batch": [cb, ch, cw],
            "cache": str(calib_cache),
        }

    try:
        serialized = builder.build_serialized_network(network, bconfig)
    finally:
        if calibrator is not None:
            calibrator.release()
    if monitor.interrupted:
        raise KeyboardInterrupt
    if calibrator is not None and calibrator.error is not None:
        raise EngineError(f"INT8 calibration failed: {calibrator.error}") from calibrator.error
    if serialized is None:
        raise EngineError(f"TensorRT could not build a plan for {spec.path}: {SINK.since(mark)}")
    if calibration is not None and calibrator is not None:
        calibration["frames_used"] = calibrator.frames

    save_timing_cache(bconfig, cache_path)
    return BuildResult(
        memoryview(serialized).tobytes(), time.perf_counter() - t0, cache_path, calibration
    )


@dataclass
class PlanReady:
    """A plan on disk for the current key."""

    key: PlanKey
    plan_path: Path
    record: PlanRecord
    built: bool  # this call built it
    # The INT8 gate's figures when this call judged an INT8 plan (int8_gate.py); with
    # "accepted": false the plan here is the FP16 one used instead.
    int8_gate: dict[str, Any] | None = None


def found_plan(engine_dir: Path, key: PlanKey) -> PlanReady | None:
    """The usable plan for ``key`` already under ``engine_dir``, if there is one."""
    found = lookup_plan(engine_dir, key)
    if found.status == "found" and found.record is not None:
        return PlanReady(key, found.plan_path, found.record, False)
    return None


def record_of(
    key: PlanKey, model_path: Path, result: BuildResult, workspace_mib: int
) -> PlanRecord:
    """The record written beside a plan this process built."""
    return make_record(
        key,
        model_path,
        result.plan,
        build_seconds=result.seconds,
        workspace_mib=workspace_mib,
        timing_cache=result.timing_cache,
        calibration=result.calibration,
        edge_vision_version=__version__,
    )


def ensure_plan(
    trt: Any,
    rt: CudaRuntime,
    spec: ModelSpec,
    config: Config,
    progress: BuildProgress,
    *,
    force: bool = False,
    build_if_missing: bool = True,
    on_calibration_frames: Callable[[int], None] | None = None,
) -> PlanReady:
    """The plan for the current key: found under ``engine_dir``, or built once (under a
    lock, so concurrent starts build it once), or an EngineError saying how to build it."""
    tcfg = config.engine.tensorrt
    key = current_key(trt, rt, spec, config)
    engine_dir = tcfg.engine_dir
    found = lookup_plan(engine_dir, key)
    if found.status == "found" and found.record is not None and not force:
        return PlanReady(key, found.plan_path, found.record, False)
    refused = int8_gate.earlier_refusal(config, key)
    if refused is not None and not force:  # refused before: FP16, without building INT8 again
        int8_gate.log_fallback(refused["summary"], int8_gate.refusal_path(engine_dir, key))
        fp16_config = int8_gate.fp16_config(config)
        fp16 = ensure_plan(trt, rt, spec, fp16_config, progress, build_if_missing=build_if_missing)
        return dataclasses.replace(fp16, int8_gate=refused)
    failed = _BUILD_FAILURES.get(key.digest)
    if failed is not None and not force:
        # The service retries its primary engine while degraded; a build that failed
        # would fail again, minutes at a time. Say so instead of building again.
        raise EngineError(
            f"building {key.stem} failed earlier in this process ({failed}); fix the cause "
            f"and run {_rebuild(config, key)}, or restart the service"
        )
    if found.status == "damaged":
        why = f"{found.problem}; rebuild with {_rebuild(config, key)}"
    elif found.others:
        why = refusal_message(found.others[0], key, config.model.path)
    else:
        why = (
            f"no TensorRT plan for this model and machine in {engine_dir} "
            f"(key {key.stem}); build it with {_rebuild(config, key)}"
        )
    if not build_if_missing and not force:
        raise EngineError(why)
    with build_lock(engine_dir, key):
        again = None if force else found_plan(engine_dir, key)  # another process built it?
        if again is not None:
            return again
        if not force:
            log.warning("%s — building it now (once)", why)
        log.info("building TensorRT plan %s (%s) in %s", key.stem, key.machine(), engine_dir)
        try:
            result = build_plan(trt, rt, spec, config, key, progress, on_calibration_frames)
        except EdgeVisionError as e:
            _BUILD_FAILURES[key.digest] = str(e).splitlines()[0]
            raise
        record = record_of(key, spec.path, result, tcfg.workspace_mib)
        gate = int8_gate.run_gate(spec, config, key, result.plan, record)
        if gate is None or gate.accepted:
            plan_path, json_path = write_plan_atomically(engine_dir, key, result.plan, record)
        else:
            refusal = int8_gate.record_refusal(engine_dir, key, gate)
    if gate is not None and not gate.accepted:
        int8_gate.log_fallback(gate.summary(), refusal)
        fp16 = ensure_plan(trt, rt, spec, int8_gate.fp16_config(config), progress)
        return dataclasses.replace(fp16, int8_gate=gate.as_dict())
    log.info(
        "TensorRT plan built in %.1f s: %s (%d bytes), record %s",
        result.seconds,
        plan_path,
        len(result.plan),
        json_path.name,
    )
    return PlanReady(key, plan_path, record, True, gate.as_dict() if gate else None)


def _rebuild(config: Config, key: PlanKey) -> str:
    # The embedded default model needs no path; a configured one is named.
    return rebuild_command(config.model.path, key.precision, key.dla_core)


def build_for_config(
    spec: ModelSpec,
    config: Config,
    progress: BuildProgress,
    *,
    force: bool = False,
    on_calibration_frames: Callable[[int], None] | None = None,
) -> PlanReady:
    """What ``edge-vision build-engine`` runs: TensorRT and the CUDA device opened here."""
    trt = import_tensorrt()
    rt = open_runtime(config.engine.cuda_backend)
    try:
        return ensure_plan(
            trt,
            rt,
            spec,
            config,
            progress,
            force=force,
            on_calibration_frames=on_calibration_frames,
        )
    finally:
        rt.close()


def load_plan(trt: Any, plan_path: Path, dla_core: int | None) -> tuple[Any, Any]:
    """``(trt.Runtime, ICudaEngine)`` from a plan file; EngineError (naming TensorRT's own
    complaint and the command to rebuild) when TensorRT refuses it."""
    logger = trt_logger(trt)
    runtime = trt.Runtime(logger)
    if dla_core is not None:
        runtime.DLA_core = dla_core
    mark = SINK.mark()
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise EngineError(
            f"TensorRT {trt.__version__} could not load {plan_path} ({SINK.since(mark)}); "
            "a plan only loads with the TensorRT version and GPU model it was built with: "
            "rebuild with edge-vision build-engine --force"
        )
    return runtime, engine
