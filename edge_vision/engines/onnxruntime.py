"""ONNX Runtime engine: the embedded CPU default (CUDA/TensorRT providers when installed)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from ..common.threads import role_pool
from ..config import Config
from ..errors import EngineError
from ..model.shape import normalise_into
from ..model.spec import ModelSpec
from .base import Engine, U8Array

F32Array = npt.NDArray[np.float32]


class OnnxRuntimeEngine(Engine):
    kind = "onnxruntime"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self._session: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        ort_cfg = config.engine.onnxruntime
        self.threads = ort_cfg.threads or (os.cpu_count() or 1)

    async def start(self) -> None:
        import onnxruntime as ort

        cfg = self.config.engine.onnxruntime
        available = ort.get_available_providers()
        providers = [p for p in cfg.providers if p in available]
        if not providers:
            raise EngineError(
                f"none of the ONNX Runtime providers {cfg.providers} is available; "
                f"this build has {available}"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._executor = role_pool(self.max_in_flight, "ort")
        loop = asyncio.get_running_loop()
        try:
            self._session = await loop.run_in_executor(
                self._executor,
                lambda: ort.InferenceSession(str(self.spec.path), opts, providers=providers),
            )
        except Exception as e:  # ORT raises its own untyped exceptions
            raise EngineError(f"ONNX Runtime could not load {self.spec.path}: {e}") from e
        self.providers = providers

    def _input_buffer(self, n: int, h: int, w: int) -> F32Array:
        """A float32 NCHW view into this worker thread's one reusable buffer."""
        need = n * 3 * h * w
        buf: F32Array | None = getattr(self._local, "buf", None)
        if buf is None or buf.size < need:  # grows to the largest batch seen, then stays
            buf = np.empty(need, np.float32)
            self._local.buf = buf
        return buf[:need].reshape(n, 3, h, w)

    def run_sync(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        """One batch, on the calling thread (the engine-only benchmark calls this)."""
        if self._session is None:
            raise RuntimeError("engine not started")
        h, w = frames[0].shape[:2]
        x = self._input_buffer(len(frames), h, w)
        normalise_into(x, list(frames), self.spec.normalisation)
        try:
            outputs = self._session.run(None, {self.spec.input_name: x})
        except Exception as e:  # ORT's exceptions share no public base class
            raise EngineError(f"ONNX Runtime failed on a {len(frames)}x{h}x{w} batch: {e}") from e
        return [np.asarray(o) for o in outputs]

    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        if self._executor is None:
            raise RuntimeError("engine not started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run_sync, frames)

    async def close(self) -> None:
        if self._executor is not None:
            # Joining worker threads blocks: do it off the loop.
            await asyncio.to_thread(self._executor.shutdown, True)
            self._executor = None
        self._session = None

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "threads": self.threads,
            "providers": getattr(self, "providers", []),
        }
