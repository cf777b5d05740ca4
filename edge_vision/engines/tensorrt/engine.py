"""The tensorrt engine: run a plan of the ONNX model on the shared CUDA run path.

The run path is :class:`~edge_vision.engines.gpu_base.GpuEngine`'s (slots, streams,
events, per-frame upload, the infer/wait/error block, teardown); what is TensorRT's own
is here: each slot holds an ``IExecutionContext`` and device buffers sized for the
profile's maximum, with tensor addresses set once; a batch is::

    letterboxed uint8 frames in pinned memory --H2D per frame (slot stream)-->
    set_input_shape + execute_async_v3 [Cast/Transpose/normalise folded into the plan]
    --D2H (slot stream)--> pinned outputs --event--> awaited without blocking the loop

Normalisation runs on the GPU as the plan's first layers (see
:func:`~edge_vision.engines.tensorrt.onnx_adapter.wrap_uint8_input` for why), so the
engine uploads the decoder's uint8 bytes as they are.

At start the engine looks for the plan of the current key under
``engine.tensorrt.engine_dir``; when there is none (or the one there was built for
another GPU / TensorRT version / precision / profile) it builds one once
(:func:`~.build.ensure_plan`), logging progress, when ``build_if_missing`` is on, and
otherwise refuses with the command that builds it. Any failure raises
:class:`~edge_vision.errors.EngineError`, which makes the service degrade to ONNX Runtime
on the CPU. Not run against a real TensorRT here: tests/integration/test_tensorrt_serving_mocked.py
drives
it with a fake module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...config import Config
from ...errors import EngineError
from ...model.spec import ModelSpec
from ..base import U8Array
from ..cuda import DeviceBuffer, PinnedBuffer
from ..gpu_base import GpuEngine, GpuSlot
from .build import INPUT, PlanReady, ensure_plan, load_plan
from .library import import_tensorrt
from .profile import ShapeProfile
from .progress import LogBuildProgress

log = logging.getLogger(__name__)


@dataclass
class _Output:
    name: str
    dtype: np.dtype[Any]


@dataclass
class _Slot(GpuSlot):
    context: Any  # trt.IExecutionContext, used by one batch at a time
    input: DeviceBuffer
    outputs: dict[str, DeviceBuffer] = field(default_factory=dict)
    host_outputs: dict[str, PinnedBuffer] = field(default_factory=dict)

    def close(self) -> None:
        for buf in (*self.outputs.values(), *self.host_outputs.values(), self.input):
            buf.close()
        super().close()


_Layout = list[tuple[_Output, tuple[int, ...]]]


class TensorRTEngine(GpuEngine[_Slot, _Layout]):
    kind = "tensorrt"
    thread_prefix = "trt"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.tcfg = config.engine.tensorrt
        self.plan: PlanReady | None = None
        self.profile: ShapeProfile | None = None
        self._trt: Any = None
        self._trt_runtime: Any = None
        self._engine: Any = None
        self._outputs: list[_Output] = []
        self._progress = LogBuildProgress()

    # -- start ----------------------------------------------------------------------

    def _start_sync(self) -> None:
        """Import, find or build the plan, load it, make the slots (launcher thread)."""
        trt = import_tensorrt()
        self._trt = trt
        rt = self._open_runtime()
        ready = ensure_plan(
            trt,
            rt,
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
            ready = ensure_plan(trt, rt, self.spec, self.config, self._progress, force=True)
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
        self.profile = ShapeProfile.from_shapes(list(lo), list(opt), list(hi))
        self.narrow_max_batch(self.profile.batch[2])

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

    def _launch(self, slot: _Slot, frames: Sequence[U8Array]) -> _Layout:
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
        self._upload_frames(slot.input.ptr, frames, slot)
        if not ctx.execute_async_v3(slot.stream.handle):
            raise EngineError(f"execute_async_v3 failed on a batch of {n} at {w}x{h}")
        for out, out_shape in layout:
            host = slot.host_outputs[out.name].view(out.dtype, out_shape)
            rt.copy_dtoh_async(host, slot.outputs[out.name].ptr, slot.stream)
        rt.record(slot.event, slot.stream)
        return layout

    def _collect(self, slot: _Slot, layout: _Layout, n: int) -> list[np.ndarray]:
        outputs = []
        for out, out_shape in layout:
            host = slot.host_outputs[out.name].view(out.dtype, out_shape)[:n]
            # Same dtypes as ONNX Runtime returns, except half outputs, widened for the heads.
            if host.dtype == np.float16:
                outputs.append(host.astype(np.float32))
            else:
                outputs.append(host.copy())
        return outputs

    # -- end ------------------------------------------------------------------------

    async def close(self) -> None:
        self._progress.cancel()  # a build still running stops at TensorRT's next step
        await super().close()

    def _release_backend(self) -> None:
        # TensorRT objects go before the memory they point at: contexts, engine, runtime.
        for slot in self._all_slots:
            slot.context = None
        self._engine = None
        self._trt_runtime = None

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "precision": self.tcfg.precision, "dla_core": self.tcfg.dla_core}
        if self.plan is not None:
            d.update(
                plan=self.plan.plan_path.name,
                key=self.plan.key.digest,
                tensorrt=self.plan.key.tensorrt_version,
                gpu=self.plan.key.gpu_name,
                built_now=self.plan.built,
                precision=self.plan.key.precision,  # fp16 when the INT8 gate refused int8
            )
            if self.plan.int8_gate is not None:
                d["int8_gate"] = self.plan.int8_gate["summary"]
        if self.profile is not None:
            d["profile"] = self.profile.as_json()
        return d
