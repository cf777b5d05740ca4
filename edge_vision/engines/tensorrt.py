"""tensorrt engine: build, cache and run a TensorRT plan of the ONNX model.

**Every TensorRT call of edge_vision is in this module** (``import tensorrt`` is lazy and
happens nowhere else); what surrounds the calls — profile, key, plan lookup, JSON record,
calibration batching, the ONNX input adapter — is plain code in
:mod:`~edge_vision.engines.trt_plan`, tested on CPUs.

Written against the TensorRT 10 Python API as its documentation and NVIDIA's samples use
it (``samples/python/common_runtime.py``, ``simple_progress_monitor``, ``efficientdet``):
named I/O tensors (``num_io_tensors``, ``get_tensor_name``/``mode``/``dtype``/``shape``),
``set_input_shape`` per batch, output shapes read from the context after it,
``set_tensor_address``, ``execute_async_v3``; ``build_serialized_network`` with an
optimisation profile, FP16/INT8 (``IInt8EntropyCalibrator2``), a timing cache,
``IProgressMonitor`` and DLA (``DeviceType.DLA`` + ``BuilderFlag.GPU_FALLBACK``).
It has NOT been run against a real TensorRT here (none can be installed on the machines of
this project); tests/test_tensorrt_mocked.py drives its control flow with a fake module.

The run path mirrors the torch engine (:mod:`.torch`): each of ``engine.in_flight`` slots
owns a CUDA stream, an event, an ``IExecutionContext`` and device buffers sized for the
profile's maximum; a batch is::

    letterboxed uint8 frames in pinned memory --H2D per frame (slot stream)-->
    set_input_shape + execute_async_v3 [Cast/Transpose/normalise folded into the plan]
    --D2H (slot stream)--> pinned outputs --event--> awaited without blocking the loop

Normalisation runs on the GPU as the plan's first layers (see
:func:`~edge_vision.engines.trt_plan.wrap_uint8_input` for why), so the engine uploads
the decoder's uint8 bytes as they are.

At start the engine looks for the plan of the current key under
``engine.tensorrt.engine_dir``; when there is none (or the one there was built for
another GPU / TensorRT version / precision / profile) it builds one once — logging
progress — when ``build_if_missing`` is on, and otherwise refuses with the command that
builds it. Any failure raises :class:`~edge_vision.errors.EngineError`, which makes the
service degrade to ONNX Runtime on the CPU.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..config import Config
from ..cuda import (
    CudaEvent,
    CudaRuntime,
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
    open_runtime,
)
from ..decode import Allocator
from ..errors import EdgeVisionError, EngineError, ModelError
from ..models import ModelSpec
from . import trt_plan as plan
from .base import Engine, SlotPool, U8Array

log = logging.getLogger(__name__)

INPUT = plan.UINT8_INPUT_NAME


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or one EngineError saying where it comes from."""
    try:
        import tensorrt
    except ImportError as e:
        raise EngineError(
            "engine 'tensorrt' needs TensorRT's Python bindings: on Jetson they come with "
            "JetPack (python3-libnvinfer), elsewhere: pip install tensorrt"
        ) from e
    return tensorrt


# ---------------------------------------------------------------------------------------
# TensorRT callbacks: logger, progress monitor, calibrator. Their base classes exist only
# once tensorrt is imported, so the classes are made by functions.


class _LogSink:
    """What the TensorRT logger records: recent errors, to put in EngineError messages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._count = 0

    def add(self, message: str) -> None:
        with self._lock:
            self._errors = [*self._errors[-19:], message]
            self._count += 1

    def mark(self) -> int:
        with self._lock:
            return self._count

    def since(self, mark: int) -> str:
        with self._lock:
            n = min(self._count - mark, len(self._errors))
            return "; ".join(self._errors[-n:]) if n > 0 else "no error was logged"


_LOGGER: Any = None
_SINK = _LogSink()
#: Plans whose build failed in this process, by key digest: not built again until a
#: forced build (``build-engine --force``) or a restart.
_BUILD_FAILURES: dict[str, str] = {}


def _logger(trt: Any) -> Any:
    """One ``trt.ILogger`` for the process (TensorRT warns when builders and runtimes are
    given different loggers), forwarding to :mod:`logging`."""
    global _LOGGER
    if _LOGGER is not None:
        return _LOGGER

    severity = trt.ILogger.Severity

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, level: Any, msg: str) -> None:
            if level in (severity.INTERNAL_ERROR, severity.ERROR):
                _SINK.add(msg)
                log.error("TensorRT: %s", msg)
            elif level == severity.WARNING:
                log.warning("TensorRT: %s", msg)
            elif level == severity.INFO:
                log.debug("TensorRT: %s", msg)  # INFO is chatty: per-layer build notes

    _LOGGER = _Logger()
    return _LOGGER


def _progress_monitor(trt: Any, sink: plan.BuildProgress) -> Any:
    """A ``trt.IProgressMonitor`` forwarding to ``sink``. Exceptions never reach TensorRT
    (it calls from its own threads); Ctrl-C during a build cancels it, as NVIDIA's
    ``simple_progress_monitor`` sample does, and is re-raised after the build returns."""

    class _Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.interrupted = False

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                sink.phase_start(phase_name, parent_phase, num_steps)
            except KeyboardInterrupt:
                self.interrupted = True
            except Exception:  # progress display must not break a build
                log.exception("build progress display failed")

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                return bool(sink.step_complete(phase_name, step)) and not self.interrupted
            except KeyboardInterrupt:
                self.interrupted = True
                return False
            except Exception:
                log.exception("build progress display failed")
                return not self.interrupted

        def phase_finish(self, phase_name: str) -> None:
            try:
                sink.phase_finish(phase_name)
            except KeyboardInterrupt:
                self.interrupted = True
            except Exception:
                log.exception("build progress display failed")

    return _Monitor()


def _entropy_calibrator(
    trt: Any,
    rt: CudaRuntime,
    batches: Iterator[np.ndarray],
    shape: tuple[int, int, int],
    cache_path: Path,
    on_frames: Callable[[int], None] | None,
) -> Any:
    """A ``trt.IInt8EntropyCalibrator2`` (the calibrator TensorRT prefers, and the one DLA
    requires) fed with real letterboxed uint8 frames, reading and writing ``cache_path``.

    ``get_batch`` copies each ``[B, H, W, 3]`` batch through pinned memory into one device
    buffer and returns its pointer; ``None`` ends calibration.
    """
    b, h, w = shape
    nbytes = b * h * w * 3

    class _Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.device: DeviceBuffer | None = None
            self.pinned: PinnedBuffer | None = None
            self.stream: CudaStream | None = None
            self.error: BaseException | None = None
            self.frames = 0

        def get_batch_size(self) -> int:
            return b

        def get_batch(self, names: list[str]) -> list[int] | None:
            try:
                batch = next(batches, None)
                if batch is None:
                    return None
                if self.device is None or self.pinned is None or self.stream is None:
                    self.device = rt.alloc_device(nbytes)
                    self.pinned = rt.alloc_pinned(nbytes)
                    self.stream = rt.create_stream()
                rt.bind_thread()  # TensorRT may call from a thread of its own
                host = self.pinned.view(np.uint8, (b, h, w, 3))
                np.copyto(host, batch)
                rt.copy_htod_async(self.device.ptr, host, self.stream)
                rt.synchronize_stream(self.stream)  # the buffer is reused by the next batch
                self.frames += b
                if on_frames is not None:
                    on_frames(b)
                return [self.device.ptr]
            except BaseException as e:  # noqa: BLE001 - reported after the build returns
                self.error = e
                return None

        def read_calibration_cache(self) -> bytes | None:
            if cache_path.is_file():
                log.info("INT8 calibration: reusing %s", cache_path)
                return cache_path.read_bytes()
            return None

        def write_calibration_cache(self, cache: Any) -> None:
            plan.write_cache_atomically(cache_path, memoryview(cache).tobytes())
            log.info("INT8 calibration cache saved to %s", cache_path)

        def release(self) -> None:
            for owned in (self.device, self.pinned, self.stream):
                if owned is not None:
                    owned.close()

    return _Calibrator()


# ---------------------------------------------------------------------------------------
# Building


def current_key(trt: Any, rt: CudaRuntime, spec: ModelSpec, config: Config) -> plan.PlanKey:
    """The key of the plan this model, config, GPU and TensorRT want."""
    tcfg = config.engine.tensorrt
    profile = plan.profile_for(spec.limits, spec.max_batch, tcfg)
    return plan.PlanKey(
        model_name=spec.name,
        model_sha256=spec.sha256,
        tensorrt_version=str(trt.__version__),
        gpu_name=rt.device_name(),
        compute_capability=rt.compute_capability(),
        precision=tcfg.precision,
        profile=profile,
        dla_core=tcfg.dla_core,
        adapter=plan.InputAdapter.for_normalisation(spec.normalisation),
    )


def _wrapped_model_bytes(spec: ModelSpec) -> bytes:
    import onnx

    try:
        model = onnx.load(str(spec.path))
    except Exception as e:  # onnx raises DecodeError and friends without a common base
        raise ModelError(f"{spec.path} is not a readable ONNX model: {e}") from e
    wrapped = plan.wrap_uint8_input(model, spec.input_name, spec.normalisation)
    try:
        data: bytes = wrapped.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        raise ModelError(f"{spec.path} is too large to hand to TensorRT's parser: {e}") from e
    return data


def _parser_errors(parser: Any) -> list[plan.ParserErrorInfo]:
    """``IParserError``s as plain values (TensorRT 10: ``node_name``/``node_operator``)."""
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        errors.append(
            plan.ParserErrorInfo(
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
    key: plan.PlanKey,
    progress: plan.BuildProgress,
    on_calibration_frames: Callable[[int], None] | None = None,
) -> BuildResult:
    """Parse the (input-adapted) ONNX model and build a serialized plan for ``key``.

    Blocking, minutes long: call it from a worker thread (or the CLI's main thread).
    """
    tcfg = config.engine.tensorrt
    plan.validate_build_settings(tcfg.precision, tcfg.dla_core, tcfg.calibration_source)
    logger = _logger(trt)
    mark = _SINK.mark()
    t0 = time.perf_counter()
    rt.bind_thread()
    model_bytes = _wrapped_model_bytes(spec)

    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    # ``path`` lets the parser find external weights next to the original model file.
    if not parser.parse(model_bytes, str(spec.path)):
        raise EngineError(
            plan.describe_parser_errors(
                spec.path, _parser_errors(parser), plan.adapter_node_count(spec.normalisation)
            )
        )
    if network.num_inputs != 1 or network.get_input(0).name != INPUT:
        raise EngineError(f"the parsed network's input is not {INPUT!r}; cannot build {spec.path}")

    bconfig = builder.create_builder_config()
    bconfig.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, tcfg.workspace_mib << 20)
    profile = builder.create_optimization_profile()
    lo, opt, hi = key.profile.shapes()
    profile.set_shape(INPUT, lo, opt, hi)
    if bconfig.add_optimization_profile(profile) < 0:
        raise EngineError(f"TensorRT refused the optimisation profile {key.profile.as_json()}")

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

    cache_path = plan.timing_cache_path(tcfg.engine_dir, key, tcfg.timing_cache)
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

    monitor = _progress_monitor(trt, progress)
    bconfig.progress_monitor = monitor

    calibrator = None
    calibration: dict[str, Any] | None = None
    if tcfg.precision == "int8":
        source = tcfg.calibration_source
        if source is None:  # validate_build_settings refused this already
            raise EngineError("INT8 needs engine.tensorrt.calibration_source")
        cb, ch, cw = plan.calibration_shape(key.profile, tcfg.calibration_batch)
        calib_cache = plan.calibration_cache_path(
            tcfg.engine_dir, key, source, tcfg.calibration_frames, (cb, ch, cw)
        )
        batches: Iterator[np.ndarray] = iter(())
        if not calib_cache.is_file():  # with a cache TensorRT asks for no frames
            frames = plan.calibration_frames(
                source, ch, cw, spec.pad_value, tcfg.calibration_frames
            )
            batches = plan.calibration_batches(frames, cb, tcfg.calibration_frames)
        calibrator = _entropy_calibrator(
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
        raise EngineError(f"TensorRT could not build a plan for {spec.path}: {_SINK.since(mark)}")
    if calibration is not None and calibrator is not None:
        calibration["frames_used"] = calibrator.frames

    built = bconfig.get_timing_cache()
    if built is not None:
        plan.write_cache_atomically(cache_path, memoryview(built.serialize()).tobytes())
    return BuildResult(
        memoryview(serialized).tobytes(), time.perf_counter() - t0, cache_path, calibration
    )


@dataclass
class PlanReady:
    """A plan on disk for the current key."""

    key: plan.PlanKey
    plan_path: Path
    record: plan.PlanRecord
    built: bool  # this call built it


def ensure_plan(
    trt: Any,
    rt: CudaRuntime,
    spec: ModelSpec,
    config: Config,
    progress: plan.BuildProgress,
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
    found = plan.lookup_plan(engine_dir, key)
    if found.status == "found" and found.record is not None and not force:
        return PlanReady(key, found.plan_path, found.record, False)
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
        why = plan.refusal_message(found.others[0], key, config.model.path)
    else:
        why = (
            f"no TensorRT plan for this model and machine in {engine_dir} "
            f"(key {key.stem}); build it with {_rebuild(config, key)}"
        )
    if not build_if_missing and not force:
        raise EngineError(why)
    with plan.build_lock(engine_dir, key):
        again = plan.lookup_plan(engine_dir, key)  # another process may have built it
        if again.status == "found" and again.record is not None and not force:
            return PlanReady(key, again.plan_path, again.record, False)
        if not force:
            log.warning("%s — building it now (once)", why)
        log.info("building TensorRT plan %s (%s) in %s", key.stem, key.machine(), engine_dir)
        try:
            result = build_plan(trt, rt, spec, config, key, progress, on_calibration_frames)
        except EdgeVisionError as e:
            _BUILD_FAILURES[key.digest] = str(e).splitlines()[0]
            raise
        record = plan.make_record(
            key,
            spec.path,
            result.plan,
            build_seconds=result.seconds,
            workspace_mib=tcfg.workspace_mib,
            timing_cache=result.timing_cache,
            calibration=result.calibration,
            edge_vision_version=__version__,
        )
        plan_path, json_path = plan.write_plan_atomically(engine_dir, key, result.plan, record)
    log.info(
        "TensorRT plan built in %.1f s: %s (%d bytes), record %s",
        result.seconds,
        plan_path,
        len(result.plan),
        json_path.name,
    )
    return PlanReady(key, plan_path, record, True)


def _rebuild(config: Config, key: plan.PlanKey) -> str:
    # The embedded default model needs no path; a configured one is named.
    return plan.rebuild_command(config.model.path, key.precision, key.dla_core)


def build_for_config(
    spec: ModelSpec,
    config: Config,
    progress: plan.BuildProgress,
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
    logger = _logger(trt)
    runtime = trt.Runtime(logger)
    if dla_core is not None:
        runtime.DLA_core = dla_core
    mark = _SINK.mark()
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise EngineError(
            f"TensorRT {trt.__version__} could not load {plan_path} ({_SINK.since(mark)}); "
            "a plan only loads with the TensorRT version and GPU model it was built with: "
            "rebuild with edge-vision build-engine --force"
        )
    return runtime, engine


# ---------------------------------------------------------------------------------------
# Running


@dataclass
class _Output:
    name: str
    dtype: np.dtype[Any]


@dataclass
class _Slot:
    index: int
    stream: CudaStream
    event: CudaEvent
    context: Any  # trt.IExecutionContext, used by one batch at a time
    input: DeviceBuffer
    outputs: dict[str, DeviceBuffer] = field(default_factory=dict)
    host_outputs: dict[str, PinnedBuffer] = field(default_factory=dict)


class TensorRTEngine(Engine):
    kind = "tensorrt"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.tcfg = config.engine.tensorrt
        self.runtime: CudaRuntime | None = None
        self.plan: PlanReady | None = None
        self.profile: plan.ShapeProfile | None = None
        self._trt: Any = None
        self._trt_runtime: Any = None
        self._engine: Any = None
        self._outputs: list[_Output] = []
        self._all_slots: list[_Slot] = []
        self._slot_pool: SlotPool[_Slot] = SlotPool(self._all_slots)
        self._launcher: ThreadPoolExecutor | None = None
        self._progress = plan.LogBuildProgress()

    @property
    def max_batch(self) -> int:
        if self.profile is None:
            return self.spec.max_batch
        return min(self.spec.max_batch, self.profile.batch[2])

    def host_allocator(self) -> Allocator | None:
        return self.runtime.pinned_allocator if self.runtime is not None else None

    # -- start ----------------------------------------------------------------------

    async def start(self) -> None:
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix="trt-launch")
        await asyncio.get_running_loop().run_in_executor(self._launcher, self._start_sync)

    def _start_sync(self) -> None:
        """Import, find or build the plan, load it, make the slots (launcher thread)."""
        trt = import_tensorrt()
        self._trt = trt
        self.runtime = open_runtime(self.config.engine.cuda_backend)
        self.runtime.bind_thread()
        ready = ensure_plan(
            trt,
            self.runtime,
            self.spec,
            self.config,
            self._progress,
            build_if_missing=self.tcfg.build_if_missing,
        )
        try:
            self._trt_runtime, self._engine = load_plan(trt, ready.plan_path, self.tcfg.dla_core)
        except EngineError as e:
            # Its record says it fits, yet TensorRT refuses it (a driver update, a plan
            # copied from elsewhere under a matching name): rebuild once if allowed.
            if ready.built or not self.tcfg.build_if_missing:
                raise
            log.warning("%s; rebuilding it once", e)
            ready = ensure_plan(
                trt, self.runtime, self.spec, self.config, self._progress, force=True
            )
            self._trt_runtime, self._engine = load_plan(trt, ready.plan_path, self.tcfg.dla_core)
        self.plan = ready
        self._bind_io()
        for i in range(self.max_in_flight):
            self._make_slot(i)
        log.info(
            "tensorrt engine: %s on %s, %s, profile %s, %d slot(s)",
            ready.plan_path.name,
            ready.key.machine(),
            ready.key.precision,
            self.profile.as_json() if self.profile else None,
            len(self._all_slots),
        )

    def _bind_io(self) -> None:
        """Check the engine's named I/O tensors against the model; read its profile."""
        trt, engine = self._trt, self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if inputs != [INPUT] or engine.get_tensor_dtype(INPUT) != trt.DataType.UINT8:
            raise EngineError(
                f"plan inputs are {inputs}, expected one uint8 {INPUT!r}: it was not built by "
                "edge-vision build-engine; rebuild with edge-vision build-engine --force"
            )
        if sorted(outputs) != sorted(self.spec.output_names):
            raise EngineError(
                f"plan outputs {outputs} differ from the model's {list(self.spec.output_names)}; "
                "rebuild with edge-vision build-engine --force"
            )
        self._outputs = []
        for name in self.spec.output_names:  # the model's order, as ONNX Runtime returns them
            try:
                dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            except TypeError as e:  # bf16/fp8 outputs have no numpy type
                raise EngineError(f"output {name!r} has a type numpy cannot hold: {e}") from e
            self._outputs.append(_Output(name, dtype))
        lo, opt, hi = engine.get_tensor_profile_shape(INPUT, 0)
        self.profile = plan.ShapeProfile.from_shapes(list(lo), list(opt), list(hi))

    def _make_slot(self, index: int) -> None:
        """A context with its stream, event and device/pinned buffers for the profile max."""
        rt, engine, profile = self._rt(), self._engine, self.profile
        if profile is None:
            raise RuntimeError("slot made before the profile was read")
        context = engine.create_execution_context()
        if context is None:
            raise EngineError(
                f"TensorRT could not create execution context {index + 1} (device memory?); "
                "lower engine.in_flight"
            )
        _, _, max_shape = profile.shapes()
        b, h, w, _ = max_shape
        slot = _Slot(
            index, rt.create_stream(), rt.create_event(), context, rt.alloc_device(b * h * w * 3)
        )
        self._all_slots.append(slot)  # owned from here on: close() frees a half-made slot too
        if not context.set_input_shape(INPUT, max_shape):
            raise EngineError(f"TensorRT refused its own profile maximum {max_shape}")
        if not context.set_tensor_address(INPUT, slot.input.ptr):
            raise EngineError(f"set_tensor_address({INPUT!r}) failed")
        for out in self._outputs:
            shape = tuple(int(d) for d in context.get_tensor_shape(out.name))
            if any(d < 0 for d in shape):
                raise EngineError(
                    f"output {out.name!r} has a data-dependent shape {shape}; unsupported"
                )
            nbytes = max(1, int(np.prod(shape)) * out.dtype.itemsize)
            slot.outputs[out.name] = rt.alloc_device(nbytes)
            slot.host_outputs[out.name] = rt.alloc_pinned(nbytes)
            # Buffers never move, so addresses are set once per context.
            if not context.set_tensor_address(out.name, slot.outputs[out.name].ptr):
                raise EngineError(f"set_tensor_address({out.name!r}) failed")

    async def prepare(self, shapes: Sequence[tuple[int, int]]) -> None:
        """Refuse early, with the reason, when a warm-up shape lies outside the profile."""
        if self.profile is None:
            raise RuntimeError("engine not started")
        for h, w in shapes:
            self.profile.check(1, h, w)

    # -- one batch ------------------------------------------------------------------

    def _rt(self) -> CudaRuntime:
        if self.runtime is None:
            raise RuntimeError("CUDA runtime used before start() or after close()")
        return self.runtime

    def _launch(
        self, slot: _Slot, frames: Sequence[U8Array]
    ) -> list[tuple[_Output, tuple[int, ...]]]:
        """Enqueue H2D → execute_async_v3 → D2H → event on the slot's stream."""
        rt, profile = self._rt(), self.profile
        if profile is None:
            raise RuntimeError("engine not started")
        rt.bind_thread()
        n = len(frames)
        h, w = frames[0].shape[:2]
        profile.check(n, h, w)
        shape = (profile.run_batch(n), h, w, 3)  # rows past n (DLA's fixed batch) are ignored
        ctx = slot.context
        if not ctx.set_input_shape(INPUT, shape):
            raise EngineError(f"set_input_shape({INPUT!r}, {shape}) refused by TensorRT")
        layout = []
        for out in self._outputs:  # shape inference has run: the context knows them now
            out_shape = tuple(int(d) for d in ctx.get_tensor_shape(out.name))
            if any(d < 0 for d in out_shape):
                raise EngineError(f"output {out.name!r} shape {out_shape} is not known")
            layout.append((out, out_shape))
        frame_bytes = h * w * 3
        for i, frame in enumerate(frames):
            rt.copy_htod_async(
                slot.input.ptr + i * frame_bytes, np.ascontiguousarray(frame), slot.stream
            )
        if not ctx.execute_async_v3(slot.stream.handle):
            raise EngineError(f"execute_async_v3 failed on a batch of {n} at {w}x{h}")
        for out, out_shape in layout:
            host = slot.host_outputs[out.name].view(out.dtype, out_shape)
            rt.copy_dtoh_async(host, slot.outputs[out.name].ptr, slot.stream)
        rt.record(slot.event, slot.stream)
        return layout

    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        if self._launcher is None or not self._all_slots:
            raise RuntimeError("engine not started")
        loop = asyncio.get_running_loop()
        async with self._slot_pool.take() as slot:
            try:
                layout = await loop.run_in_executor(self._launcher, self._launch, slot, frames)
                await self._rt().wait(slot.event)
            except RuntimeError as e:  # pybind11 reports TensorRT misuse as RuntimeError
                raise EngineError(f"tensorrt engine failed on a batch of {len(frames)}: {e}") from e
            n = len(frames)
            outputs = []
            for out, out_shape in layout:
                host = slot.host_outputs[out.name].view(out.dtype, out_shape)[:n]
                # Copy out: the slot's pinned buffer is reused by the next batch. Same dtypes
                # as ONNX Runtime returns, except half outputs, widened for the heads.
                if host.dtype == np.float16:
                    outputs.append(host.astype(np.float32))
                else:
                    outputs.append(host.copy())
            return outputs

    # -- end ------------------------------------------------------------------------

    async def close(self) -> None:
        self._progress.cancel()  # a build still running stops at TensorRT's next step
        if self._launcher is not None:
            await asyncio.to_thread(self._launcher.shutdown, True)
            self._launcher = None
        # TensorRT objects go before the memory they point at: contexts, engine, runtime.
        for slot in self._all_slots:
            slot.context = None
        self._engine = None
        self._trt_runtime = None
        for slot in self._all_slots:
            for buf in (*slot.outputs.values(), *slot.host_outputs.values(), slot.input):
                buf.close()
            slot.event.close()
            slot.stream.close()
        self._all_slots.clear()
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "precision": self.tcfg.precision, "dla_core": self.tcfg.dla_core}
        if self.plan is not None:
            d.update(
                plan=self.plan.plan_path.name,
                key=self.plan.key.digest,
                tensorrt=self.plan.key.tensorrt_version,
                gpu=self.plan.key.gpu_name,
                built_now=self.plan.built,
            )
        if self.profile is not None:
            d["profile"] = self.profile.as_json()
        if self.runtime is not None:
            d["cuda_backend"] = self.runtime.name
        return d
