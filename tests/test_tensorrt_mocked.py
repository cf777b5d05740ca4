"""The tensorrt engine's control flow, driven by a MOCK ``tensorrt`` module and a mock CUDA
layer, because neither TensorRT nor a GPU can exist on this machine.

What this proves: the engine and ``edge-vision build-engine`` make the TensorRT 10 calls
in a workable order (parse → profile → flags → timing cache → progress monitor →
calibrator → ``build_serialized_network``; ``deserialize_cuda_engine`` → named I/O →
``set_input_shape`` → ``get_tensor_shape`` → ``set_tensor_address`` →
``execute_async_v3``), find, reuse, refuse and rebuild plans as the key says, feed the
calibrator real frames, write plan + JSON + caches, degrade to ONNX Runtime on failure
and free what they allocate; and that the text recogniser gets its own plan, built the
same way (its profile, its key beside the detector's, strings equal to ONNX Runtime's,
ONNX Runtime with a log line when TensorRT is absent). What it cannot prove: that real
TensorRT behaves like this mock. The mock mirrors the signatures of the TensorRT 10.3
Python bindings (``python/src/infer/pyCore.cpp``), and its "plan" runs the input-adapted
ONNX graph with ONNX Runtime, so outputs are real model outputs.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge_vision.cli import main
from edge_vision.config import Config
from edge_vision.cuda.base import CudaEvent, CudaRuntime, CudaStream, DeviceBuffer, PinnedBuffer
from edge_vision.decode_batch import DeviceFrame
from edge_vision.engines import create_engine, gpu_base
from edge_vision.engines.tensorrt import build as trt_build
from edge_vision.engines.tensorrt import library as trt_library
from edge_vision.engines.tensorrt import recogniser as trt_recogniser
from edge_vision.errors import EngineError
from edge_vision.infer import InferenceService
from edge_vision.models import ModelSpec
from edge_vision.pipeline import FramePipeline, FrameSettings
from edge_vision.read import (
    OnnxRuntimeRecogniser,
    ReadStage,
    TextReader,
    _sample_crops,
    default_recogniser_path,
    load_recogniser,
    recogniser_batches,
)
from edge_vision.receive import FrameMessage
from edge_vision.shape import letterbox_into, plan_for_frame

from .support.images import text_scene
from .support.server import make_config
from .support.video import write_image_folder

# ---------------------------------------------------------------------------------------
# The mock CUDA layer: "device" memory is host memory, every copy is immediate.


class _Buffer:
    def __init__(self, state: MockState, nbytes: int) -> None:
        self._host = np.zeros(max(1, nbytes), np.uint8)
        self.nbytes = nbytes
        self.state = state
        state.open_buffers += 1

    def _release(self) -> None:
        self.state.open_buffers -= 1


class _MockPinned(_Buffer, PinnedBuffer):
    @property
    def array(self) -> np.ndarray:
        return self._host


class _MockDevice(_Buffer, DeviceBuffer):
    def __init__(self, state: MockState, nbytes: int) -> None:
        _Buffer.__init__(self, state, nbytes)
        self.ptr = int(self._host.ctypes.data)


class _MockStream(CudaStream):
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def _release(self) -> None:
        pass


class _MockEvent(CudaEvent):
    def __init__(self) -> None:
        self.handle = 0

    def _release(self) -> None:
        pass


class MockCudaRuntime(CudaRuntime):
    name = "mock-cuda"

    def __init__(self, state: MockState) -> None:
        self.state = state
        self._streams = 0

    def device_name(self) -> str:
        return self.state.gpu

    def compute_capability(self) -> tuple[int, int]:
        return (9, 0)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        return _MockPinned(self.state, nbytes)

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        return _MockDevice(self.state, nbytes)

    def create_stream(self) -> CudaStream:
        self._streams += 1
        return _MockStream(1000 + self._streams)

    def create_event(self) -> CudaEvent:
        return _MockEvent()

    def copy_htod_async(self, dst: int, src: np.ndarray, stream: CudaStream) -> None:
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def copy_dtoh_async(self, dst: np.ndarray, src: int, stream: CudaStream) -> None:
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def copy_dtod_async(self, dst: int, src: int, nbytes: int, stream: CudaStream) -> None:
        self.state.stream_log.append(("copy", stream.handle))
        ctypes.memmove(dst, src, nbytes)

    def record(self, event: CudaEvent, stream: CudaStream) -> None:
        pass

    def query(self, event: CudaEvent) -> bool:
        return True

    def synchronize_event(self, event: CudaEvent) -> None:
        if self.state.gpu_done is not None:
            self.state.synchronising.set()
            self.state.gpu_done.wait(30)

    def synchronize_stream(self, stream: CudaStream) -> None:
        pass


# ---------------------------------------------------------------------------------------
# The mock tensorrt module (TensorRT 10 Python API surface the engine uses)


@dataclass
class MockState:
    version: str = "10.3.0"
    gpu: str = "NVIDIA MockGPU"
    dla_cores: int = 2
    unsupported_ops: set[str] = field(default_factory=set)
    fail_execute: bool = False
    refuse_deserialize: int = 0  # refuse this many loads (a plan TensorRT will not take)
    builds: list[dict[str, Any]] = field(default_factory=list)
    timing_caches_given: list[bytes] = field(default_factory=list)
    calibration_batches: list[np.ndarray] = field(default_factory=list)
    calibration_cache_read: bytes | None = None
    runtime_dla_cores: list[int] = field(default_factory=list)
    executions: int = 0
    parses: int = 0
    open_buffers: int = 0
    stream_log: list[tuple[str, Any]] = field(default_factory=list)  # GPU-side waits, copies
    # When set, an event synchronise blocks until it is set (a batch still on the GPU);
    # ``synchronising`` is set once a run thread waits there.
    gpu_done: threading.Event | None = None
    synchronising: threading.Event = field(default_factory=threading.Event)


def _read(ptr: int, nbytes: int) -> np.ndarray:
    return np.frombuffer(ctypes.string_at(ptr, nbytes), np.uint8).copy()


def make_mock_tensorrt(state: MockState) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = state.version  # type: ignore[attr-defined]

    class Enum:
        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            return self.name

        __str__ = __repr__

    def enum(*names: str) -> type:
        return type("E", (), {n: Enum(n) for n in names})

    Severity = enum("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE")
    trt.MemoryPoolType = enum("WORKSPACE")  # type: ignore[attr-defined]
    trt.BuilderFlag = enum("FP16", "INT8", "GPU_FALLBACK")  # type: ignore[attr-defined]
    trt.DeviceType = enum("GPU", "DLA")  # type: ignore[attr-defined]
    trt.TensorIOMode = enum("INPUT", "OUTPUT")  # type: ignore[attr-defined]
    DataType = enum("UINT8", "FLOAT", "HALF", "INT32")
    trt.DataType = DataType  # type: ignore[attr-defined]
    ErrorCode = enum("UNSUPPORTED_NODE")
    numpy_types = {
        DataType.UINT8: np.uint8,
        DataType.FLOAT: np.float32,
        DataType.HALF: np.float16,
        DataType.INT32: np.int32,
    }
    # The plan's tensor types: those of the parsed ONNX graph's inputs and outputs.
    onnx_types = {
        onnx.TensorProto.UINT8: DataType.UINT8,
        onnx.TensorProto.FLOAT: DataType.FLOAT,
        onnx.TensorProto.INT32: DataType.INT32,
    }

    def nptype(dtype: Any) -> Any:
        return numpy_types[dtype]

    trt.nptype = nptype  # type: ignore[attr-defined]

    class ILogger:
        def __init__(self) -> None:
            pass

    ILogger.Severity = Severity  # type: ignore[attr-defined]
    trt.ILogger = ILogger  # type: ignore[attr-defined]

    class IProgressMonitor:
        def __init__(self) -> None:
            pass

    class IInt8EntropyCalibrator2:
        def __init__(self) -> None:
            pass

    trt.IProgressMonitor = IProgressMonitor  # type: ignore[attr-defined]
    trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2  # type: ignore[attr-defined]

    @dataclass
    class Tensor:
        name: str

    class Network:
        def __init__(self) -> None:
            self.inputs: list[Tensor] = []
            self.outputs: list[str] = []
            self.model = b""

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        def get_input(self, i: int) -> Tensor:
            return self.inputs[i]

    class ParserError:
        def __init__(self, index: int, node: Any) -> None:
            self.index, self.node_proto = index, node

        def code(self) -> Any:
            return ErrorCode.UNSUPPORTED_NODE

        def desc(self) -> str:
            return f"no importer registered for op: {self.node_proto.op_type}"

        def node(self) -> int:
            return self.index

        def node_name(self) -> str:
            return str(self.node_proto.name)

        def node_operator(self) -> str:
            return str(self.node_proto.op_type)

        def file(self) -> str:
            return "ModelImporter.cpp"

        def line(self) -> int:
            return 1

        def func(self) -> str:
            return "parseNode"

    class OnnxParser:
        def __init__(self, network: Network, logger: Any) -> None:
            self.network, self.errors = network, []

        def parse(self, model: bytes, path: str | None = None) -> bool:
            state.parses += 1
            proto = onnx.load_from_string(bytes(model))
            self.errors = [
                ParserError(i, n)
                for i, n in enumerate(proto.graph.node)
                if n.op_type in state.unsupported_ops
            ]
            if self.errors:
                return False
            self.network.inputs = [Tensor(i.name) for i in proto.graph.input]
            self.network.outputs = [o.name for o in proto.graph.output]
            self.network.model = bytes(model)
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int) -> ParserError:
            return self.errors[i]

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

        def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
            self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def serialize(self) -> bytes:
            return self.data

    class BuilderConfig:
        def __init__(self) -> None:
            self.flags: set[str] = set()
            self.pools: dict[str, int] = {}
            self.profiles: list[Profile] = []
            self.default_device_type = trt.DeviceType.GPU  # type: ignore[attr-defined]
            self.DLA_core = -1
            self.progress_monitor: Any = None
            self._calibrator: Any = None
            self.calibration_profile: Profile | None = None
            self.timing_cache: TimingCache | None = None

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            self.pools[pool.name] = size

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def set_flag(self, flag: Any) -> None:
            self.flags.add(flag.name)

        def create_timing_cache(self, data: bytes) -> TimingCache:
            state.timing_caches_given.append(bytes(data))
            return TimingCache(bytes(data))

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            if cache.data and not cache.data.startswith(f"TC:{state.gpu}".encode()):
                return False  # made on another device
            self.timing_cache = cache
            return True

        def get_timing_cache(self) -> TimingCache | None:
            return self.timing_cache

        # TensorRT 10.1+ marks implicit INT8 calibration deprecated with a DeprecationWarning.
        def set_calibration_profile(self, profile: Profile) -> bool:
            warnings.warn("Deprecated in TensorRT 10.1", DeprecationWarning, stacklevel=2)
            self.calibration_profile = profile
            return True

        @property
        def int8_calibrator(self) -> Any:
            return self._calibrator

        @int8_calibrator.setter
        def int8_calibrator(self, calibrator: Any) -> None:
            warnings.warn("Deprecated in TensorRT 10.1", DeprecationWarning, stacklevel=2)
            self._calibrator = calibrator

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        @property
        def num_DLA_cores(self) -> int:
            return state.dla_cores

        def create_network(self, flags: int = 0) -> Network:
            assert flags == 0
            return Network()

        def create_builder_config(self) -> BuilderConfig:
            return BuilderConfig()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> Any:
            (name,) = [t.name for t in network.inputs]
            shapes = config.profiles[0].shapes[name]
            record = {
                "flags": sorted(config.flags),
                "device": config.default_device_type.name,
                "dla_core": config.DLA_core,
                "profile": shapes,
                "workspace": config.pools.get("WORKSPACE"),
            }
            monitor = config.progress_monitor
            monitor.phase_start("Building engine", None, 2)
            monitor.phase_start("Tactic timing", "Building engine", 3)
            for step in range(3):
                if not monitor.step_complete("Tactic timing", step):
                    monitor.phase_finish("Tactic timing")
                    monitor.phase_finish("Building engine")
                    return None
            monitor.phase_finish("Tactic timing")
            monitor.step_complete("Building engine", 0)
            if "INT8" in config.flags:
                calibrator = config.int8_calibrator
                cshape = config.calibration_profile.shapes[name][1]  # type: ignore[union-attr]
                record["calibration_shape"] = cshape
                cached = calibrator.read_calibration_cache()
                if cached is None:
                    assert calibrator.get_batch_size() == cshape[0]
                    while True:
                        ptrs = calibrator.get_batch([name])
                        if not ptrs:
                            break
                        arr = _read(ptrs[0], int(np.prod(cshape))).reshape(cshape)
                        state.calibration_batches.append(arr)
                    calibrator.write_calibration_cache(b"calibration-table")
                else:
                    state.calibration_cache_read = bytes(cached)
            monitor.step_complete("Building engine", 1)
            monitor.phase_finish("Building engine")
            state.builds.append(record)
            if config.timing_cache is not None:
                old = config.timing_cache.data or f"TC:{state.gpu}".encode()
                config.timing_cache.data = old + b"+tactics"
            header = {
                "version": trt.__version__,  # type: ignore[attr-defined]
                "gpu": state.gpu,
                "input": name,
                "outputs": network.outputs,
                "profile": [list(s) for s in shapes],
            }
            return json.dumps(header).encode() + b"\n" + network.model

    class Engine:
        def __init__(self, header: dict[str, Any], model: bytes) -> None:
            self.header, self.model = header, model
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 2
            self.session = ort.InferenceSession(model, opts, ["CPUExecutionProvider"])
            self.names = [header["input"], *header["outputs"]]
            graph = onnx.load_from_string(model).graph
            self.dtypes = {
                v.name: onnx_types[v.type.tensor_type.elem_type]
                for v in (*graph.input, *graph.output)
            }
            self._out_shapes: dict[tuple[int, ...], dict[str, tuple[int, ...]]] = {}
            self._lock = threading.Lock()

        @property
        def num_io_tensors(self) -> int:
            return len(self.names)

        def get_tensor_name(self, i: int) -> str:
            return self.names[i]

        def get_tensor_mode(self, name: str) -> Any:
            io = trt.TensorIOMode  # type: ignore[attr-defined]
            return io.INPUT if name == self.header["input"] else io.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return self.dtypes[name]

        def input_dtype(self) -> np.dtype[Any]:
            return np.dtype(numpy_types[self.dtypes[self.header["input"]]])

        def get_tensor_profile_shape(self, name: str, index: int) -> list[list[int]]:
            assert name == self.header["input"] and index == 0
            return [list(s) for s in self.header["profile"]]

        def create_execution_context(self) -> Context:
            return Context(self)

        def output_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
            with self._lock:  # "shape inference": run once per input shape
                if shape not in self._out_shapes:
                    zeros = np.zeros(shape, self.input_dtype())
                    outs = self.session.run(None, {self.header["input"]: zeros})
                    self._out_shapes[shape] = {
                        n: o.shape for n, o in zip(self.header["outputs"], outs, strict=True)
                    }
                return self._out_shapes[shape]

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.shape: tuple[int, ...] | None = None
            self.addresses: dict[str, int] = {}

        def set_input_shape(self, name: str, shape: Any) -> bool:
            lo, _, hi = self.engine.header["profile"]
            shape = tuple(shape)
            if not all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
                return False
            self.shape = shape
            return True

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            assert self.shape is not None
            if name == self.engine.header["input"]:
                return self.shape
            return self.engine.output_shapes(self.shape)[name]

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            if state.fail_execute or self.shape is None:
                return False
            dtype = self.engine.input_dtype()
            nbytes = int(np.prod(self.shape)) * dtype.itemsize
            x = _read(self.addresses[self.engine.header["input"]], nbytes).view(dtype)
            outs = self.engine.session.run(
                None, {self.engine.header["input"]: x.reshape(self.shape)}
            )
            for out_name, out in zip(self.engine.header["outputs"], outs, strict=True):
                data = np.ascontiguousarray(out)  # in the plan's output type
                ctypes.memmove(self.addresses[out_name], data.ctypes.data, data.nbytes)
            state.executions += 1
            return True

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = logger
            self.DLA_core = -1

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            header_line, _, model = bytes(data).partition(b"\n")
            header = json.loads(header_line)
            if self.DLA_core >= 0:
                state.runtime_dla_cores.append(self.DLA_core)
            if state.refuse_deserialize > 0 or header["version"] != trt.__version__:  # type: ignore[attr-defined]
                state.refuse_deserialize = max(0, state.refuse_deserialize - 1)
                self.logger.log(
                    Severity.ERROR,
                    "IRuntime::deserializeCudaEngine: The engine plan file is not compatible "
                    "with this version of TensorRT, please rebuild.",
                )
                return None
            return Engine(header, model)

    trt.Builder = Builder  # type: ignore[attr-defined]
    trt.OnnxParser = OnnxParser  # type: ignore[attr-defined]
    trt.Runtime = Runtime  # type: ignore[attr-defined]
    return trt


@pytest.fixture
def mock_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MockState, types.ModuleType]]:
    state = MockState()
    module = make_mock_tensorrt(state)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr(trt_library, "_LOGGER", None)  # the logger class is per module
    monkeypatch.setattr(trt_build, "_BUILD_FAILURES", {})
    for opener in (trt_build, gpu_base, trt_recogniser):  # builds, engine and recogniser starts
        monkeypatch.setattr(opener, "open_runtime", lambda *a, **k: MockCudaRuntime(state))
    yield state, module


@pytest.fixture
def cpu_torch() -> Any:
    """torch (its CPU build here), imported before the test's event loop runs."""
    return pytest.importorskip(
        "torch", reason="torch is not installed here (device frames are torch tensors)"
    )


def trt_config(engine_dir: Path, **tensorrt: Any) -> Any:
    return make_config(
        {
            "engine": {
                "kind": "tensorrt",
                "fallback": "none",
                "max_batch": 4,  # the plan's profile: batches of 1..4
                "in_flight": 2,
                "warmup_shapes": [[720, 1280]],  # a 16:9 camera: input 352x640
                "retry_primary_s": 0,
                "tensorrt": {"engine_dir": str(engine_dir), **tensorrt},
            }
        }
    )


def ort_reference(spec: ModelSpec, frames: list[np.ndarray]) -> np.ndarray:
    """The original model on ONNX Runtime with the CPU normalisation: what serving gives."""
    from edge_vision.shape import normalise_into

    x = np.empty((len(frames), 3, *frames[0].shape[:2]), np.float32)
    normalise_into(x, frames, spec.normalisation)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(spec.path), opts, ["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {spec.input_name: x})[0]
    return out


async def start_and_close(spec: ModelSpec, engine_dir: Path) -> None:
    """A TensorRT engine with the default settings, started (building its plan in
    ``engine_dir`` if it has none there) and closed."""
    engine = create_engine("tensorrt", spec, trt_config(engine_dir))
    await engine.start()
    await engine.close()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


# ---------------------------------------------------------------------------------------


async def test_mock_tensorrt_engine_builds_once_then_reuses_its_plan_and_matches_onnxruntime(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    await engine.start()
    try:
        assert engine.max_batch == 4 and len(state.builds) == 1
        assert state.builds[0]["flags"] == ["FP16"]
        # Tuned (OPT) for a 16:9 frame's input as the default model's stretch picks it.
        assert state.builds[0]["profile"] == ((1, 32, 32, 3), (4, 352, 640, 3), (4, 640, 640, 3))
        await engine.prepare([(352, 640), (640, 352)])
        rng = np.random.default_rng(5)
        wide = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8) for _ in range(2)]
        tall = [rng.integers(0, 256, (640, 352, 3), dtype=np.uint8)]
        # Two batches at once: one per slot, each with its own context and buffers.
        got_wide, got_tall = await _gather(engine.infer(wide), engine.infer(tall))
        description = engine.describe()
    finally:
        await engine.close()
    for got, frames in ((got_wide[0], wide), (got_tall[0], tall)):
        ref = await _to_thread(ort_reference, spec, frames)
        assert got.shape == ref.shape and got.dtype == np.float32
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert state.open_buffers == 0  # close() freed every device and pinned buffer
    assert description["built_now"] is True and description["tensorrt"] == "10.3.0"
    files = await _to_thread(listing, tmp_path)
    stem = Path(str(description["plan"])).stem
    assert files == [f"{stem}.json", f"{stem}.plan", "timing-nvidia-mockgpu-sm_90-trt10-3-0.cache"]

    again = create_engine("tensorrt", spec, trt_config(tmp_path))
    await again.start()
    try:
        assert again.describe()["built_now"] is False and again.describe()["plan"] == f"{stem}.plan"
        out = await again.infer(tall)
    finally:
        await again.close()
    assert len(state.builds) == 1  # never rebuilt at start
    np.testing.assert_array_equal(out[0], got_tall[0])


async def test_mock_tensorrt_a_cancelled_batch_keeps_its_slot_until_its_outputs_are_copied_out(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    """A client gone mid-batch must not let the next batch into a slot whose pinned
    outputs the first batch's run thread is still to copy out: with one slot, the next
    batch waits for that copy-out, then gets its own outputs."""
    state, _ = mock_trt
    config = trt_config(tmp_path)
    config.engine.in_flight = 1
    engine = create_engine("tensorrt", spec, config)
    await engine.start()
    try:
        rng = np.random.default_rng(7)
        first = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8)]
        second = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8)]
        state.gpu_done = threading.Event()
        gone = asyncio.create_task(engine.infer(first))
        assert await _to_thread(state.synchronising.wait, 10), "the batch never reached the GPU"
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert engine._slot_pool.free == 0, "a slot went back while its copy-out was pending"
        nxt = asyncio.create_task(engine.infer(second))
        await asyncio.sleep(0.2)
        assert state.executions == 1, "the next batch ran in the slot of a pending copy-out"
        assert not nxt.done()
        state.gpu_done.set()
        got = await asyncio.wait_for(nxt, 10)
    finally:
        if state.gpu_done is not None:
            state.gpu_done.set()
        await engine.close()
    ref = await _to_thread(ort_reference, spec, second)
    assert np.linalg.norm(got[0] - ref) / np.linalg.norm(ref) < 1e-5
    assert state.open_buffers == 0


async def test_mock_tensorrt_takes_gpu_decoded_frames_once_its_stream_has_waited_for_their_decode(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu_torch: Any,
) -> None:
    """TensorRT gets the GPU decoder's frames through the shared GPU engine base: its
    slot's stream waits, on the GPU, for each decode batch's event before the
    device-to-device copies (mock events and streams: CI has no GPU), then serves them
    as it serves host frames; the slot lets go of them once the batch is done."""
    torch = cpu_torch
    state, _ = mock_trt

    class _WaitingStream:  # the slot's stream as torch sees it (ExternalStream)
        def __init__(self, handle: int, device: Any = None) -> None:
            self.handle = handle

        def wait_event(self, event: Any) -> None:
            state.stream_log.append(("wait", (self.handle, event)))

    monkeypatch.setattr(torch.cuda, "ExternalStream", _WaitingStream)
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    await engine.start()
    try:
        rng = np.random.default_rng(11)
        pixels = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8) for _ in range(4)]
        decoded_together, decoded_later = object(), object()  # two decode batches' events
        frames: list[Any] = [
            DeviceFrame(torch.from_numpy(pixels[0]), decoded_together),
            DeviceFrame(torch.from_numpy(pixels[1]), decoded_together),
            pixels[2],  # decoded on the host
            DeviceFrame(torch.from_numpy(pixels[3]), decoded_later),
        ]
        got = await engine.infer(frames)
        slots_reading = [len(slot.reading) for slot in engine._all_slots]
    finally:
        await engine.close()
    (slot_stream,) = {handle for kind, handle in state.stream_log if kind == "copy"}
    assert state.stream_log == [
        ("wait", (slot_stream, decoded_together)),
        ("wait", (slot_stream, decoded_later)),
        ("copy", slot_stream),
        ("copy", slot_stream),
        ("copy", slot_stream),
    ]
    assert slots_reading == [0, 0]  # let go once the batch was done
    ref = await _to_thread(ort_reference, spec, pixels)
    assert np.linalg.norm(got[0] - ref) / np.linalg.norm(ref) < 1e-5


async def test_mock_tensorrt_plan_for_another_tensorrt_version_is_refused_or_rebuilt_by_config(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, trt = mock_trt
    await start_and_close(spec, tmp_path)  # a plan for this machine, in tmp_path
    trt.__version__ = "10.7.0"  # type: ignore[attr-defined]  # JetPack upgraded

    strict = create_engine("tensorrt", spec, trt_config(tmp_path, build_if_missing=False))
    with pytest.raises(EngineError) as refused:
        await strict.start()
    await strict.close()
    message = str(refused.value)
    assert "plan built for NVIDIA MockGPU (sm_90)/TensorRT 10.3.0" in message
    assert "this machine is NVIDIA MockGPU (sm_90)/TensorRT 10.7.0" in message
    assert message.endswith(
        "rebuild with edge-vision build-engine --precision fp16 (with the same --config as serve)"
    )
    assert len(state.builds) == 1

    rebuilding = create_engine("tensorrt", spec, trt_config(tmp_path))
    await rebuilding.start()
    try:
        assert rebuilding.describe()["tensorrt"] == "10.7.0"
    finally:
        await rebuilding.close()
    assert len(state.builds) == 2
    files = await _to_thread(listing, tmp_path)
    assert sum(f.endswith(".plan") for f in files) == 2  # the old plan stays for the old key
    assert "timing-nvidia-mockgpu-sm_90-trt10-7-0.cache" in files


async def test_mock_tensorrt_without_a_plan_and_building_off_says_how_to_build_and_degrades(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    cfg = trt_config(tmp_path, build_if_missing=False)
    cfg.engine.fallback = "onnxruntime"
    service = InferenceService(spec, cfg)
    await service.start()
    try:
        assert service.status.active == "onnxruntime" and service.status.degraded
        reason = str(service.status.reason)
        assert "no TensorRT plan for this model and machine" in reason
        assert "build it with edge-vision build-engine" in reason
    finally:
        await service.close()
    assert mock_trt[0].builds == []


async def test_mock_tensorrt_run_time_failure_degrades_to_onnxruntime_and_the_frame_is_answered(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    cfg = trt_config(tmp_path)
    cfg.engine.fallback = "onnxruntime"
    scene = text_scene(1280, 720, texts=[("PART 77-A", (300, 260))])
    msg = FrameMessage(1, 0.0, scene.jpeg(), False, 0.0)
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    try:
        assert service.status.active == "tensorrt"
        on_trt = await pipeline.process(msg, FrameSettings(0.5))
        state.fail_execute = True  # the GPU goes away mid-stream
        on_cpu = await pipeline.process(msg, FrameSettings(0.5))
        status = service.status
    finally:
        await pipeline.close()
        await service.close()
    assert len(on_trt.detections) == 1 and len(on_cpu.detections) == 1
    np.testing.assert_allclose(on_cpu.detections[:, :4], on_trt.detections[:, :4], atol=1.0)
    assert status.active == "onnxruntime" and status.degraded
    assert "execute_async_v3 failed" in str(status.reason)


async def test_mock_tensorrt_parser_errors_name_the_unsupported_nodes(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    state.unsupported_ops = {"Resize"}
    model = await _to_thread(onnx.load, str(spec.path))
    resizes = [(i, n.name) for i, n in enumerate(model.graph.node) if n.op_type == "Resize"]
    assert resizes
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    with pytest.raises(EngineError) as failed:
        await engine.start()
    await engine.close()
    lines = str(failed.value).splitlines()
    assert lines[0] == f"TensorRT's ONNX parser rejected {spec.path} ({len(resizes)} error(s)):"
    for (index, name), line in zip(resizes, lines[1:], strict=True):
        assert line == (
            f"  node {name!r} (Resize, #{index}): UNSUPPORTED_NODE: "
            "no importer registered for op: Resize"
        )
    assert await _to_thread(listing, tmp_path) == []  # nothing half-built left behind

    # While degraded the service retries its engine; a failed build is not redone each time.
    retry = create_engine("tensorrt", spec, trt_config(tmp_path))
    with pytest.raises(EngineError, match="failed earlier in this process"):
        await retry.start()
    await retry.close()
    assert state.parses == 1


async def test_mock_tensorrt_plan_refused_by_tensorrt_is_rebuilt_once_when_allowed(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    await start_and_close(spec, tmp_path)  # a plan for this machine, in tmp_path

    state.refuse_deserialize = 1
    strict = create_engine("tensorrt", spec, trt_config(tmp_path, build_if_missing=False))
    with pytest.raises(EngineError, match=r"could not load .*not compatible.*rebuild"):
        await strict.start()
    await strict.close()

    state.refuse_deserialize = 1
    await start_and_close(spec, tmp_path)  # allowed to build: heals the plan
    assert len(state.builds) == 2  # rebuilt once, in place, then loaded


def test_mock_tensorrt_build_engine_calibrates_int8_on_real_frames_and_reuses_its_caches(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    write_image_folder(tmp_path / "frames", 480, 270, frames=10)
    engines = tmp_path / "engines"
    argv = [
        "build-engine",
        str(spec.path),
        "--precision",
        "int8",
        "--calibration",
        str(tmp_path / "frames"),
        "--calibration-frames",
        "9",
        "--engine-dir",
        str(engines),
        "--set",
        "engine.tensorrt.calibration_batch=4",
        "--set",
        "engine.max_batch=4",  # the calibration batch is capped at the profile's max batch
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("built ") and "record: " in out
    build = state.builds[0]
    # The profile's OPT: a 16:9 frame's input with the default model's stretch.
    assert build["flags"] == ["FP16", "INT8"] and build["calibration_shape"] == (4, 352, 640, 3)
    # 9 frames at batch 4: two full batches of real frames fitted as serving fits them
    # (stretched to fill the input), the rest dropped.
    assert [b.shape for b in state.calibration_batches] == [(4, 352, 640, 3)] * 2
    first = cv2.imread(str(tmp_path / "frames" / "frame_0.png"))
    expected = np.empty((352, 640, 3), np.uint8)
    served = plan_for_frame(480, 270, spec.limits)
    assert served.shape == (352, 640) and spec.limits.fit == "stretch"
    letterbox_into(first, served, expected, spec.pad_value)
    np.testing.assert_array_equal(state.calibration_batches[0][0], expected)
    record = json.loads(next(engines.glob("*.json")).read_text())
    assert record["calibration"]["frames_used"] == 8
    calib_cache = Path(record["calibration"]["cache"])
    assert calib_cache.read_bytes() == b"calibration-table"

    assert main(argv) == 0  # nothing changed: nothing built
    assert capsys.readouterr().out.startswith("up to date: ")
    assert len(state.builds) == 1

    assert main([*argv, "--force"]) == 0
    assert len(state.builds) == 2 and len(state.calibration_batches) == 2  # not recalibrated
    assert state.calibration_cache_read == b"calibration-table"
    assert state.timing_caches_given[0] == b"" and state.timing_caches_given[1].startswith(b"TC:")


def test_mock_tensorrt_dla_build_targets_the_core_with_gpu_fallback_and_a_static_profile(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    static = ["--set", "model.min_side=640", "--set", "model.max_side=640", "--max-batch", "1"]
    argv = ["build-engine", "--dla-core", "1", "--engine-dir", str(tmp_path), *static]
    assert main(argv) == 0
    build = state.builds[0]
    assert build["device"] == "DLA" and build["dla_core"] == 1
    assert build["flags"] == ["FP16", "GPU_FALLBACK"]
    assert build["profile"] == ((1, 640, 640, 3),) * 3
    assert "-dla1-" in capsys.readouterr().out

    assert main([*argv[:2], "2", *argv[3:]]) == 2
    assert "DLA core 2 requested; this device has 2 DLA core(s)" in capsys.readouterr().err


async def test_mock_tensorrt_dla_plan_loads_on_its_core_and_pads_batches(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    cfg = trt_config(tmp_path, dla_core=0)
    cfg.model.min_side = cfg.model.max_side = 640
    cfg.engine.max_batch = 2  # a DLA profile is static: every batch runs as 2
    from edge_vision.models import load_model_spec

    dla_spec = await _to_thread(load_model_spec, cfg.model)
    engine = create_engine("tensorrt", dla_spec, cfg)
    await engine.start()
    try:
        frame = np.full((640, 640, 3), 90, np.uint8)
        out = await engine.infer([frame])  # runs as a batch of 2, one row returned
    finally:
        await engine.close()
    assert state.runtime_dla_cores == [0]
    assert state.builds[0]["profile"] == ((2, 640, 640, 3),) * 3
    assert out[0].shape == (1, 1, 640, 640)


# ---------------------------------------------------------------------------------------
# The recogniser's plan (edge_vision.engines.tensorrt.recogniser): the mock "plan" runs the
# recogniser with its arg-max appended on ONNX Runtime, so the strings read are real ones.


def reading_config(engine_dir: Path, **read: Any) -> Config:
    return make_config(
        {
            "engine": {"kind": "tensorrt", "tensorrt": {"engine_dir": str(engine_dir)}},
            "read": {"max_width": 960, **read},
        }
    )


@pytest.fixture(scope="module")
def cpu_reader() -> TextReader:
    return TextReader(OnnxRuntimeRecogniser(default_recogniser_path(), threads=2))


def test_mock_tensorrt_recogniser_builds_a_second_plan_and_reads_as_onnx_runtime_does(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path, cpu_reader: TextReader
) -> None:
    state, _ = mock_trt
    cfg = reading_config(tmp_path)
    rec = load_recogniser(None, "tensorrt", config=cfg)
    try:
        assert isinstance(rec, trt_recogniser.TensorRTRecogniser)
        (build,) = state.builds
        # NCHW float32 crops: batches 1..6 (read.batch), height 48, widths 320..960.
        assert build["profile"] == ((1, 3, 48, 320), (6, 3, 48, 320), (6, 3, 48, 960))
        assert build["flags"] == ["FP16"]  # engine.tensorrt.precision fp16 (the default)
        assert rec.describe()["built_now"] is True and rec.max_width == 960
        crops = _sample_crops(np.random.default_rng(3), 8)
        got = TextReader(rec).read_crops(crops)
        want = cpu_reader.read_crops(crops)
        assert [g.text for g in got] == [w.text for w in want]
        assert got[0].text.startswith("LOT ")
        np.testing.assert_allclose([g.score for g in got], [w.score for w in want], atol=1e-5)
        # Only the arg-max and its probability come back: two [N, T] arrays.
        x = recogniser_batches(crops, 6)[0][1]
        idx, prob = rec.run(x)
        assert idx.shape == prob.shape == (6, x.shape[3] // 8) and idx.dtype == np.int64
    finally:
        rec.close()
    assert state.open_buffers == 0  # close() freed every device and pinned buffer
    files = listing(tmp_path)
    plans = [f for f in files if f.endswith(".plan")]
    assert len(plans) == 1 and plans[0].startswith("pp-ocrv6-rec-small-fp16-nvidia-mockgpu-")

    again = load_recogniser(None, "tensorrt", config=cfg)
    try:
        assert isinstance(again, trt_recogniser.TensorRTRecogniser)
        assert again.describe()["built_now"] is False and again.describe()["plan"] == plans[0]
    finally:
        again.close()
    assert len(state.builds) == 1  # found again by its key, not rebuilt


async def test_mock_tensorrt_recogniser_plan_lives_beside_the_detector_s_with_its_own_key(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path, spec: ModelSpec
) -> None:
    state, _ = mock_trt
    await start_and_close(spec, tmp_path)  # the detector's plan
    cfg = reading_config(tmp_path)
    cfg.engine.tensorrt.precision = "fp32"
    rec = await asyncio.to_thread(load_recogniser, None, "tensorrt", config=cfg)
    rec_key = rec.plan.key if isinstance(rec, trt_recogniser.TensorRTRecogniser) else None
    if isinstance(rec, trt_recogniser.TensorRTRecogniser):
        rec.close()
    assert rec_key is not None and rec_key.precision == "fp32"
    assert state.builds[1]["flags"] == []  # an FP32 plan: no FP16 flag
    files = await asyncio.to_thread(listing, tmp_path)
    assert sum(f.endswith(".plan") for f in files) == 2
    assert sum(f.endswith(".json") for f in files) == 2
    # One timing cache for the GPU and TensorRT version, shared by both builds.
    assert [f for f in files if f.startswith("timing-")] == [
        "timing-nvidia-mockgpu-sm_90-trt10-3-0.cache"
    ]
    assert state.timing_caches_given[1].startswith(b"TC:")


def test_mock_tensorrt_recogniser_squeezes_a_crop_wider_than_its_profile(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    rec = load_recogniser(None, "tensorrt", config=reading_config(tmp_path, max_width=640))
    try:
        line = np.full((20, 1200, 3), 230, np.uint8)  # 60:1, 2880 px wide at height 48
        (batch,) = recogniser_batches([line], 6, max_width=rec.max_width)
        assert batch[1].shape == (1, 3, 48, 640)
        (read,) = TextReader(rec).read_crops([line])  # runs inside the profile
        assert read.text == ""
        with pytest.raises(Exception, match="outside the TensorRT profile"):
            rec.run(np.zeros((1, 3, 48, 704), np.float32))
    finally:
        rec.close()


def test_mock_tensorrt_build_engine_read_builds_the_recogniser_plan_ahead_of_serve(
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    argv = ["build-engine", "--read", "--engine-dir", str(tmp_path), "--set", "read.max_width=640"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(state.builds) == 2  # the detector's plan, then the recogniser's
    assert state.builds[1]["profile"] == ((1, 3, 48, 320), (6, 3, 48, 320), (6, 3, 48, 640))
    assert "recogniser built " in out and "pp-ocrv6-rec-small-fp16-" in out
    assert main(argv) == 0  # nothing changed: nothing built
    assert "recogniser up to date: " in capsys.readouterr().out and len(state.builds) == 2
    cfg = make_config(
        {
            "engine": {
                "kind": "tensorrt",
                "tensorrt": {"engine_dir": str(tmp_path), "build_if_missing": False},
            },
            "read": {"max_width": 640},
        }
    )
    rec = load_recogniser(None, "tensorrt", config=cfg)  # serve finds it, builds nothing
    try:
        assert isinstance(rec, trt_recogniser.TensorRTRecogniser)
        assert rec.describe()["built_now"] is False
    finally:
        rec.close()
    assert main([*argv, "--force"]) == 0 and len(state.builds) == 4


async def test_mock_tensorrt_read_stage_follows_engine_kind_and_a_failed_run_sends_boxes_unread(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    stage = ReadStage(reading_config(tmp_path))
    assert stage.engine_kind == "tensorrt"  # read.engine: auto follows engine.kind
    try:
        reader = await stage.reader()
        assert reader.recogniser.kind == "tensorrt"
        image = np.full((120, 400, 3), 235, np.uint8)
        import cv2

        cv2.putText(image, "K4 77", (20, 80), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (20, 20, 20), 3)
        dets = np.array([[10, 30, 200, 100, 0.9, 0]], np.float32)
        reading = stage.session()
        (text,) = await stage.read(
            reading, dets, None, 0.0, lambda: (image, lambda: None), wait=True
        )
        assert text is not None and text.text.replace(" ", "") == "K477"
        state.fail_execute = True  # the GPU goes away: the boxes still go, unread
        later = dets.copy()
        later[0, 2] = 380  # a box much wider: read again
        (gone,) = await stage.read(
            reading, later, None, 1.0, lambda: (image, lambda: None), wait=True
        )
        assert stage.failures == 1 and gone is not None and gone.text == text.text  # carried
    finally:
        await stage.close()


def test_mock_tensorrt_absent_the_recogniser_falls_back_to_onnx_runtime_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    with caplog.at_level(logging.WARNING, logger="edge_vision.read"):
        rec = load_recogniser(None, "tensorrt", threads=1, config=reading_config(tmp_path))
    assert isinstance(rec, OnnxRuntimeRecogniser)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "edge_vision.read"]
    assert "runs on ONNX Runtime on the CPU" in line and "TensorRT's Python bindings" in line


async def _gather(*aws: Any) -> list[Any]:
    return list(await asyncio.gather(*aws))


async def _to_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)
