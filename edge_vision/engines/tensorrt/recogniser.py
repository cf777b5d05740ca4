"""The text recogniser as a second TensorRT plan, built and cached like the detector's.

With ``engine.kind: tensorrt`` (and ``read.engine: auto``) :mod:`edge_vision.frames.read` runs
the recogniser here instead of on ONNX Runtime. What differs from the detector's plan:

* **input**: ``[N, 3, 48, W]`` float32, the crops as
:func:`edge_vision.frames.read.recogniser_batches`
  makes them (resized, normalised, padded with 0); the padding is a float 0, which a
  uint8 input cannot carry, so no uint8 adapter;
* **profile** (:func:`~.profile.recogniser_profile`, ``NCHW``): batch ``1..read.batch``,
  height 48, width 320 (the nominal width, no batch is narrower) up to ``read.max_width``,
  tuned for a full batch at 320;
* **outputs**: the arg-max class and its probability per column, computed in the plan
  (:func:`~.onnx_adapter.append_argmax`), so two ``[N, T]`` arrays come back;
* **precision**: FP32 when ``engine.tensorrt.precision`` is fp32, else FP16 (no INT8:
  there are no calibration crops; an INT8 detector reads with an FP16 recogniser);
* one execution context, used by the read stage's one worker thread at a time.

The key (:class:`~.plan_store.PlanKey`: the recogniser's SHA-256, TensorRT version, GPU,
precision, profile, input layout) names its own plan file beside the detector's in
``engine.tensorrt.engine_dir``, so both are found again at the next start; the timing
cache is shared (same GPU and TensorRT version). Not run against a real TensorRT here:
tests/integration/test_tensorrt_recogniser_mocked.py drives it with its mock module.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...config import Config
from ...errors import EngineError, ModelError
from ...model.spec import default_recogniser_path, file_sha256
from ..cuda import CudaRuntime, open_runtime
from .build import (
    BuildResult,
    PlanReady,
    builder_config,
    found_plan,
    load_plan,
    parse_network,
    record_of,
    save_timing_cache,
    use_timing_cache,
)
from .library import SINK, import_tensorrt
from .onnx_adapter import ARGMAX_OUTPUT, MAX_OUTPUT, append_argmax
from .plan_store import (
    InputAdapter,
    PlanKey,
    build_lock,
    timing_cache_path,
    write_plan_atomically,
)
from .profile import ShapeProfile, recogniser_profile
from .progress import BuildProgress, LogBuildProgress, progress_monitor

log = logging.getLogger(__name__)

#: The recogniser plan's input, as its key records it (read.py normalises on the CPU).
RECOGNISER_ADAPTER = InputAdapter(
    "NCHW float32 BGR, arg-max in the plan", (127.5,) * 3, (127.5,) * 3, False
)


def _input_name(model: Any) -> str:
    initialisers = {i.name for i in model.graph.initializer}
    inputs = [str(i.name) for i in model.graph.input if i.name not in initialisers]
    if len(inputs) != 1:
        raise ModelError(f"the recogniser has {len(inputs)} inputs; expected one [N, 3, 48, W]")
    return inputs[0]


def recogniser_key(trt: Any, rt: CudaRuntime, path: Path, config: Config) -> PlanKey:
    """The key of the recogniser plan this model, config, GPU and TensorRT want."""
    tcfg, r = config.engine.tensorrt, config.read
    return PlanKey(
        model_name=path.stem,
        model_sha256=file_sha256(path),
        tensorrt_version=str(trt.__version__),
        gpu_name=rt.device_name(),
        compute_capability=rt.compute_capability(),
        precision="fp32" if tcfg.precision == "fp32" else "fp16",
        profile=recogniser_profile(r.batch, r.max_width),
        dla_core=None,
        adapter=RECOGNISER_ADAPTER,
    )


def build_recogniser_plan(
    trt: Any, rt: CudaRuntime, path: Path, config: Config, key: PlanKey, progress: BuildProgress
) -> BuildResult:
    """Parse the recogniser (with its arg-max appended) and build a plan for ``key``.
    Blocking, a minute or more: call it from a worker thread."""
    import onnx

    tcfg = config.engine.tensorrt
    mark = SINK.mark()
    t0 = time.perf_counter()
    rt.bind_thread()
    try:
        model = onnx.load(str(path))
    except Exception as e:  # onnx raises DecodeError and friends without a common base
        raise ModelError(f"{path} is not a readable ONNX model: {e}") from e
    name = _input_name(model)
    data: bytes = append_argmax(model).SerializeToString()
    builder, network, _parser = parse_network(trt, data, path, 0, name)
    bconfig = builder_config(trt, builder, key, name, tcfg.workspace_mib)
    if key.precision == "fp16":
        bconfig.set_flag(trt.BuilderFlag.FP16)
    cache_path = use_timing_cache(
        bconfig, timing_cache_path(tcfg.engine_dir, key, tcfg.timing_cache)
    )
    monitor = progress_monitor(trt, progress)
    bconfig.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, bconfig)
    if monitor.interrupted:
        raise KeyboardInterrupt
    if serialized is None:
        raise EngineError(f"TensorRT could not build a plan for {path}: {SINK.since(mark)}")
    save_timing_cache(bconfig, cache_path)
    return BuildResult(memoryview(serialized).tobytes(), time.perf_counter() - t0, cache_path, None)


def ensure_recogniser_plan(
    trt: Any,
    rt: CudaRuntime,
    path: Path,
    config: Config,
    progress: BuildProgress,
    *,
    force: bool = False,
) -> PlanReady:
    """The recogniser plan for the current key: found under ``engine_dir``, or built once
    under the build lock (``engine.tensorrt.build_if_missing``, or ``force``), or an
    EngineError."""
    tcfg = config.engine.tensorrt
    key = recogniser_key(trt, rt, path, config)
    found = None if force else found_plan(tcfg.engine_dir, key)
    if found is not None:
        return found
    if not tcfg.build_if_missing and not force:
        raise EngineError(
            f"no TensorRT plan for the recogniser {path.name} in {tcfg.engine_dir} (key "
            f"{key.stem}) and engine.tensorrt.build_if_missing is off"
        )
    with build_lock(tcfg.engine_dir, key):
        again = None if force else found_plan(tcfg.engine_dir, key)  # another process built it?
        if again is not None:
            return again
        log.info("building the recogniser's TensorRT plan %s (%s)", key.stem, key.machine())
        result = build_recogniser_plan(trt, rt, path, config, key, progress)
        record = record_of(key, path, result, tcfg.workspace_mib)
        plan_path, _ = write_plan_atomically(tcfg.engine_dir, key, result.plan, record)
    log.info("recogniser plan built in %.1f s: %s", result.seconds, plan_path)
    return PlanReady(key, plan_path, record, True)


def build_recogniser_for_config(
    config: Config, progress: BuildProgress, *, force: bool = False
) -> PlanReady:
    """What ``edge-vision build-engine --read`` runs: the recogniser's plan (``read.model_path``
    or the wheel's), TensorRT and the CUDA device opened here."""
    path = config.read.model_path or default_recogniser_path()
    if not path.is_file():
        raise ModelError(f"recogniser model {path} does not exist")
    trt = import_tensorrt()
    rt = open_runtime(config.engine.cuda_backend)
    try:
        return ensure_recogniser_plan(trt, rt, path, config, progress, force=force)
    finally:
        rt.close()


class TensorRTRecogniser:
    """The recogniser's plan on the GPU: :class:`edge_vision.frames.read.Recogniser`'s ``run``.

    One context, stream and set of buffers sized for the profile's maximum; ``run`` is
    synchronous (the read stage calls it from its worker thread) and serialised by a lock.
    """

    kind = "tensorrt"

    def __init__(self, path: Path, config: Config) -> None:
        import onnx

        proto = onnx.load(str(path), load_external_data=False)
        self.metadata: dict[str, str] = {p.key: p.value for p in proto.metadata_props}
        self.input_name = _input_name(proto)
        self._lock = threading.Lock()
        self._owned: list[Any] = []
        trt = import_tensorrt()
        self._trt = trt
        self.rt = open_runtime(config.engine.cuda_backend)
        try:
            self.plan = ensure_recogniser_plan(trt, self.rt, path, config, LogBuildProgress())
            self._runtime, self._engine = load_plan(trt, self.plan.plan_path, None)
            self._bind()
        except BaseException:
            self.close()
            raise
        log.info(
            "recogniser on TensorRT: %s (%s), profile %s",
            self.plan.plan_path.name,
            self.plan.key.precision,
            self.profile.as_json(),
        )

    def _bind(self) -> None:
        trt, engine, rt = self._trt, self._engine, self.rt
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = sorted(n for n in names if n not in inputs)
        if inputs != [self.input_name] or outputs != sorted([ARGMAX_OUTPUT, MAX_OUTPUT]):
            raise EngineError(
                f"recogniser plan {self.plan.plan_path.name} has inputs {inputs} and outputs "
                f"{outputs}; delete it to have it rebuilt"
            )
        lo, opt, hi = engine.get_tensor_profile_shape(self.input_name, 0)
        self.profile: ShapeProfile = ShapeProfile.from_shapes(lo, opt, hi, "NCHW")
        self.max_width: int | None = self.profile.width[2]
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineError("TensorRT could not create the recogniser's execution context")
        self.stream = rt.create_stream()
        # Waited on asleep (a blocking-sync event), not by spinning a core on the stream.
        self._done = rt.create_event()
        self._owned += [self.stream, self._done]
        _, _, max_shape = self.profile.shapes()
        if not self.context.set_input_shape(self.input_name, max_shape):
            raise EngineError(f"TensorRT refused its own profile maximum {max_shape}")
        self._buffers: dict[str, tuple[Any, Any, np.dtype[Any]]] = {}
        for name in (self.input_name, ARGMAX_OUTPUT, MAX_OUTPUT):
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
            nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
            device, pinned = rt.alloc_device(nbytes), rt.alloc_pinned(nbytes)
            self._owned += [device, pinned]
            self._buffers[name] = (device, pinned, dtype)
            if not self.context.set_tensor_address(name, device.ptr):
                raise EngineError(f"set_tensor_address({name!r}) failed")

    def run(
        self, x: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        n, _, h, w = x.shape
        self.profile.check(n, h, w)
        with self._lock:
            rt, ctx = self.rt, self.context
            rt.bind_thread()
            if not ctx.set_input_shape(self.input_name, tuple(x.shape)):
                raise EngineError(f"set_input_shape({self.input_name!r}, {x.shape}) refused")
            device, pinned, dtype = self._buffers[self.input_name]
            host = pinned.view(dtype, tuple(x.shape))
            np.copyto(host, x, casting="same_kind")
            rt.copy_htod_async(device.ptr, host, self.stream)
            if not ctx.execute_async_v3(self.stream.handle):
                raise EngineError(f"the recogniser's execute_async_v3 failed on {x.shape}")
            out = []
            for name in (ARGMAX_OUTPUT, MAX_OUTPUT):
                device, pinned, dtype = self._buffers[name]
                shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
                view = pinned.view(dtype, shape)
                rt.copy_dtoh_async(view, device.ptr, self.stream)
                out.append(view)
            rt.record(self._done, self.stream)
            rt.synchronize_event(self._done)
            return out[0].astype(np.int64), out[1].astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "plan": self.plan.plan_path.name,
            "built_now": self.plan.built,
            "precision": self.plan.key.precision,
            "profile": self.profile.as_json(),
        }

    def close(self) -> None:
        """Free the context, engine and buffers (contexts before the memory they use)."""
        self.context = None
        self._engine = None
        self._runtime = None
        for owned in reversed(self._owned):
            owned.close()
        self._owned = []
        if getattr(self, "rt", None) is not None:
            self.rt.close()
