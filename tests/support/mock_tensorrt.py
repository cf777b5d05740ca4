"""A MOCK TensorRT 10 ``tensorrt`` module and a mock CUDA layer, because neither TensorRT
nor a GPU can exist on this machine; with the ``mock_trt`` fixture that installs them and
the helpers the mocked TensorRT tests share (tests/integration/test_tensorrt_*_mocked.py and the
tests that borrow the mock: tests/integration/test_doctor.py, tests/integration/test_int8_gate.py).

The mock mirrors the signatures of the TensorRT 10.3 Python bindings
(``python/src/infer/pyCore.cpp``), and its "plan" runs the input-adapted ONNX graph with
ONNX Runtime, so outputs are real model outputs. The mock CUDA layer's "device" memory
is host memory and every copy is immediate. What tests against it cannot prove: that
real TensorRT behaves like this mock.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge_vision.engines import create_engine, gpu_base
from edge_vision.engines.cuda.base import (
    CudaEvent,
    CudaRuntime,
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
)
from edge_vision.engines.tensorrt import build as trt_build
from edge_vision.engines.tensorrt import library as trt_library
from edge_vision.engines.tensorrt import recogniser as trt_recogniser
from edge_vision.model.spec import ModelSpec

from .server import make_config

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
    from edge_vision.model.shape import normalise_into

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


async def _to_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)
