"""torch engine: the ONNX graph through torch, with CUDA graphs and an in-flight pipeline.

The run path (slots with a CUDA stream and an event each, per-frame upload, the
infer/wait/error block, teardown) is :class:`~.gpu_base.GpuEngine`'s; what is torch's own
is here: each slot also holds pinned host memory for outputs and one captured CUDA graph
per (batch bucket, H, W). A batch is::

    letterboxed uint8 frames, already in pinned memory (the decode pool's allocator is
    the CUDA layer's pinned allocator while this engine is active)
    --H2D per frame (slot stream)--> graph replay
       [uint8 NHWC -> normalised NCHW fp16 -> network -> fp32 outputs
        (a DBNet map: -> its byte map, post.DB_MAP_BYTES; a YOLO v8/v11 output: -> its
         best anchors NMS'd, post.yolo_v8_device_nms; engine.torch.device_post)]
    --D2H (slot stream)--> pinned outputs --event--> copied out, all on a run thread

so batch k+1's copies run while batch k computes on another stream. Batch sizes are
rounded up to power-of-two buckets (padding rows are ignored) to bound how many graphs
are captured. The TensorRT engine runs on the same base; this engine is how this project
proves the CUDA pipeline on real GPUs where TensorRT is absent.

On ``engine.torch.device: cpu`` it runs eagerly (no pinned memory, no graphs): slow, but
it lets CI check the converter and engine against ONNX Runtime without a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Config
from ..errors import EngineError
from ..model.device_post import db_map_bytes, yolo_v8_device_nms
from ..model.heads import is_db_map, is_yolo_v8_raw
from ..model.spec import ModelSpec
from .base import U8Array
from .cuda import PinnedBuffer
from .gpu_base import GpuEngine, GpuSlot
from .torch_compile import CompiledForward, release_compile_workers, use_cache_dir

log = logging.getLogger(__name__)


def batch_bucket(n: int, max_batch: int) -> int:
    """Smallest power of two >= n, capped at max_batch."""
    b = 1
    while b < n:
        b *= 2
    return min(b, max_batch)


@dataclass
class _Graph:
    static_in: Any  # torch uint8 [B, H, W, 3] on the device
    outputs: list[Any]  # torch fp32 outputs on the device
    graph: Any | None  # torch.cuda.CUDAGraph, or None when eager


@dataclass
class _Slot(GpuSlot):
    torch_stream: Any
    pinned_out: PinnedBuffer | None = None
    graphs: dict[tuple[int, int, int], _Graph] = field(default_factory=dict)
    pool: Any = None  # CUDA graph memory pool shared by this slot's graphs

    def close(self) -> None:
        if self.pinned_out is not None:
            self.pinned_out.close()
        self.graphs.clear()
        super().close()


_Layout = list[tuple[int, tuple[int, ...], Any]]  # bytes, shape, numpy dtype of each output


class TorchEngine(GpuEngine[_Slot, _Layout]):
    kind = "torch"
    thread_prefix = "torch"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.tcfg = config.engine.torch
        self._torch: Any = None
        self._module: Any = None
        self._device: Any = None
        self._scale: Any = None
        self._shift: Any = None
        self.graph_captures = 0
        self._capturing = threading.Lock()
        # engine.torch.compile: the compiled forward of each input shape, shared by the slots
        self._compiled: dict[tuple[int, ...], CompiledForward] = {}
        # On the device (engine.torch.device_post): a DBNet map is made a byte map, a
        # YOLO v8/v11 output is NMS'd (its best anchors, each marked kept or not).
        self._db_threshold: float | None = None
        self._yolo_candidates: int | None = None

    @property
    def cuda(self) -> bool:
        return self._device is not None and self._device.type == "cuda"

    @property
    def accepts_device_frames(self) -> bool:
        return self.cuda and self.runtime is not None

    # -- start ----------------------------------------------------------------------

    def _start_sync(self) -> None:
        try:
            import torch
        except ImportError as e:
            raise EngineError("engine 'torch' needs torch: pip install torch") from e
        self._torch = torch
        device = torch.device(self.tcfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(
                f"engine.torch.device is {self.tcfg.device} but CUDA is not available to torch"
            )
        self._device = device
        # Optional dependency: the converter imports torch.
        from .onnx_torch import OnnxGraphModule

        dtype = torch.float16 if (self.tcfg.fp16 and self.cuda) else torch.float32
        if self.cuda and dtype == torch.float32:
            # FP32 means FP32: cuDNN would otherwise run convolutions in TF32 on Ampere+.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        t0 = time.perf_counter()
        module = OnnxGraphModule(self.spec.path, dtype=dtype).eval()
        if self.cuda:
            torch.cuda.set_device(self._device)
        self._module = module.to(self._device)
        if self.cuda and self.tcfg.channels_last:
            # The NHWC uint8 input permuted to NCHW is channels-last already; the weights
            # follow, and cuDNN times its algorithms in the warm-up runs before capture.
            self._module = self._module.to(memory_format=torch.channels_last)
            torch.backends.cudnn.benchmark = True
        scale, shift = (torch.from_numpy(a) for a in self.spec.normalisation.scale_shift())
        self._scale = scale.reshape(1, 3, 1, 1).to(self._device, dtype)
        self._shift = shift.reshape(1, 3, 1, 1).to(self._device, dtype)
        self._dtype = dtype
        if self.tcfg.compile != "off":
            try:
                use_cache_dir(self.tcfg.compile_cache)
            except OSError as e:  # torch's own default under /tmp instead
                log.warning("engine.torch.compile_cache %s: %s", self.tcfg.compile_cache, e)
        if self.cuda and self.tcfg.device_post:
            head = self.config.model.head
            if head in ("auto", "dbnet"):
                self._db_threshold = self.config.model.dbnet.bin_threshold
            if head in ("auto", "yolo_v8"):
                self._yolo_candidates = self.tcfg.yolo_candidates
        if self.cuda:
            rt = self._open_runtime(self._device.index or 0)
            for i in range(self.max_in_flight):
                stream = rt.create_stream()
                self._all_slots.append(
                    _Slot(
                        i,
                        stream,
                        rt.create_event(),
                        self._torch.cuda.ExternalStream(stream.handle, device=self._device),
                        pool=torch.cuda.graph_pool_handle(),
                    )
                )
        log.info(
            "torch engine: %s on %s (%s) in %.1f s",
            self.spec.name,
            self._device,
            dtype,
            time.perf_counter() - t0,
        )

    async def prepare(self, shapes: Sequence[tuple[int, int]]) -> None:
        """With ``engine.torch.compile``, compile every batch bucket of each warm-up shape
        first; then capture CUDA graphs for every slot, bucket and shape, with progress.
        Compiling takes tens of seconds a shape, so it happens only here: a shape first
        seen while serving runs the interpreter (:meth:`_run_forward`)."""
        buckets = sorted({batch_bucket(b, self.max_batch) for b in range(1, self.max_batch + 1)})
        loop = asyncio.get_running_loop()
        if self.tcfg.compile != "off":
            for b in buckets:
                for h, w in shapes:
                    await loop.run_in_executor(self._launcher, self._compile, (b, h, w, 3))
            await loop.run_in_executor(self._launcher, release_compile_workers)
        if not self.cuda or not self.tcfg.cuda_graphs:
            return
        todo = [(s, b, h, w) for s in self._all_slots for b in buckets for h, w in shapes]
        t0 = time.perf_counter()
        for i, (slot, b, h, w) in enumerate(todo, 1):
            await loop.run_in_executor(self._launcher, self._graph_for, slot, b, h, w)
            if i % max(1, len(todo) // 10) == 0 or i == len(todo):
                log.info(
                    "capturing CUDA graphs: %d/%d (%.1f s)", i, len(todo), time.perf_counter() - t0
                )

    # -- the graph of one bucket ----------------------------------------------------

    def _forward(self, static_in: Any) -> list[Any]:
        x = static_in.permute(0, 3, 1, 2)
        if self.spec.normalisation.rgb:
            x = x.flip(1)
        x = x.to(self._dtype) * self._scale + self._shift
        # Contiguous: the D2H copies read each output as packed rows (channels-last
        # convolutions may leave a 4-D output strided NHWC).
        outputs = [o.float().contiguous() for o in self._module(x)]
        shapes = [tuple(o.shape) for o in outputs]
        t = self._db_threshold
        if t is not None and is_db_map(shapes):
            return [db_map_bytes(self._torch, outputs[0], t)]
        k = self._yolo_candidates
        if k is not None and is_yolo_v8_raw(shapes):
            return yolo_v8_device_nms(self._torch, outputs[0], k, self.config.model.nms_iou)
        return outputs

    def _compile(self, shape: tuple[int, ...]) -> None:
        """``engine.torch.compile``: trace and compile the forward for a uint8 NHWC input
        of ``shape``, and run it once, which compiles it (the launcher thread, in
        :meth:`prepare`)."""
        torch = self._torch
        if shape in self._compiled or self._module is None:
            return
        with torch.no_grad():
            x = torch.zeros(shape, dtype=torch.uint8, device=self._device)
            fn = CompiledForward(torch, self._forward, x, self.tcfg.compile)
            fn(x)
            if self.cuda:
                torch.cuda.synchronize(self._device)
        self._compiled[shape] = fn

    def _run_forward(self, x: Any) -> list[Any]:
        """:meth:`_forward`, through the compiled graph of ``x``'s shape where
        :meth:`prepare` compiled one (``engine.torch.compile``)."""
        fn = self._compiled.get(tuple(x.shape))
        out: list[Any] = fn(x) if fn is not None else self._forward(x)
        return out

    def _graph_for(self, slot: _Slot, b: int, h: int, w: int) -> _Graph:
        key = (b, h, w)
        found = slot.graphs.get(key)
        if found is not None:
            return found
        with self._capturing:  # one capture at a time, whichever run thread meets a new shape
            return self._capture(slot, b, h, w)

    def _capture(self, slot: _Slot, b: int, h: int, w: int) -> _Graph:
        torch = self._torch
        with torch.no_grad(), torch.cuda.stream(slot.torch_stream):
            static_in = torch.zeros((b, h, w, 3), dtype=torch.uint8, device=self._device)
            for _ in range(2):  # warm-up on the side stream before capture (cuDNN autotune,
                outputs = self._run_forward(static_in)  # and engine.torch.compile's compile)
            graph = None
            if self.tcfg.cuda_graphs:
                try:
                    graph = torch.cuda.CUDAGraph()
                    # thread_local: other run threads keep running their batches
                    # while this thread captures.
                    with torch.cuda.graph(
                        graph,
                        pool=slot.pool,
                        stream=slot.torch_stream,
                        capture_error_mode="thread_local",
                    ):
                        outputs = self._run_forward(static_in)
                    self.graph_captures += 1
                except RuntimeError as e:  # capture refused: run this bucket eagerly
                    log.warning(
                        "CUDA graph capture failed for batch %d at %dx%d (%s); running eagerly",
                        b,
                        w,
                        h,
                        e,
                    )
                    graph = None
                    outputs = self._run_forward(static_in)
        slot.torch_stream.synchronize()
        g = _Graph(static_in, outputs, graph)
        slot.graphs[(b, h, w)] = g
        return g

    # -- one batch ------------------------------------------------------------------

    def _launch(self, slot: _Slot, frames: Sequence[U8Array]) -> _Layout:
        """Enqueue H2D → replay → D2H → event on the slot's stream (run thread)."""
        torch, rt = self._torch, self._rt()
        rt.bind_thread()
        h, w = frames[0].shape[:2]
        b = batch_bucket(len(frames), self.max_batch)
        g = self._graph_for(slot, b, h, w)
        out_layout = [
            (o.numel() * o.element_size(), tuple(o.shape), _numpy_dtype(o)) for o in g.outputs
        ]
        out_bytes = sum(n for n, _, _ in out_layout)
        if slot.pinned_out is None or slot.pinned_out.nbytes < out_bytes:
            if slot.pinned_out is not None:  # grows during warm-up, then stays
                slot.pinned_out.close()
            slot.pinned_out = rt.alloc_pinned(out_bytes)
        # Rows past len(frames) are padding, never read.
        n = len(frames)
        with torch.cuda.stream(slot.torch_stream):
            self._upload_frames(g.static_in.data_ptr(), frames, slot, into=g.static_in)
            if g.graph is not None:
                g.graph.replay()
            else:
                with torch.no_grad():
                    for dst, src in zip(g.outputs, self._run_forward(g.static_in), strict=True):
                        dst.copy_(src)
        offset = 0
        for (nbytes, shape, dtype), out in zip(out_layout, g.outputs, strict=True):
            # Only the n real rows come back; bucket padding rows stay on the device.
            rows = slot.pinned_out.array[offset : offset + nbytes].view(dtype).reshape(shape)
            rt.copy_dtoh_async(rows[:n], out.data_ptr(), slot.stream)
            offset += nbytes
        rt.record(slot.event, slot.stream)
        return out_layout

    def _cpu_run(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        torch = self._torch
        with torch.no_grad():
            x = torch.from_numpy(np.stack(frames))
            n = len(frames)
            b = batch_bucket(n, self.max_batch)
            if self._compiled and b > n:  # the compiled shapes are the batch buckets
                x = torch.cat([x, x.new_zeros((b - n, *x.shape[1:]))])
            return [o[:n].numpy() for o in self._run_forward(x)]

    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        if self._launcher is not None and not self.cuda:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._launcher, self._cpu_run, frames)
        return await super().infer(frames)

    def _collect(self, slot: _Slot, layout: _Layout, n: int) -> list[np.ndarray]:
        pinned = slot.pinned_out
        if pinned is None:
            raise RuntimeError("batch finished without output buffers")
        outputs, offset = [], 0
        for nbytes, shape, dtype in layout:
            host = pinned.array[offset : offset + nbytes].view(dtype).reshape(shape)
            outputs.append(host[:n].copy())
            offset += nbytes
        return outputs

    def _release_backend(self) -> None:
        # The compiled graphs hold the weights (and the engine, through _forward).
        self._compiled.clear()
        self._module = None

    def describe(self) -> dict[str, Any]:
        d = {
            **super().describe(),
            "device": str(self._device),
            "fp16": self.tcfg.fp16,
            "cuda_graphs": self.tcfg.cuda_graphs,
            "graphs_captured": self.graph_captures,
            "device_post": self._db_threshold is not None or self._yolo_candidates is not None,
            "channels_last": self.cuda and self.tcfg.channels_last,
            "compile": self.tcfg.compile,
            "compiled_shapes": sum(1 for f in self._compiled.values() if f.compiled),
        }
        if self.runtime is not None:
            d["gpu"] = self.runtime.device_name()
        return d


def _numpy_dtype(tensor: Any) -> Any:
    """The numpy dtype of a torch tensor's elements (float32 outputs, uint8 byte maps)."""
    return np.dtype(str(tensor.dtype).removeprefix("torch."))
