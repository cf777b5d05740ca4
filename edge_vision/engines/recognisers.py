"""The text recogniser's runners, one per engine kind, behind one small interface
(:class:`Recogniser`); :func:`load_recogniser` picks one by ``read.engine``. The reading
stage that feeds them crops and decodes their output is :mod:`edge_vision.frames.read`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..config import Config
from ..errors import EngineError, ModelError
from ..model.spec import default_recogniser_path

log = logging.getLogger(__name__)

F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class Recogniser(Protocol):
    """Runs the recognition network on one batch."""

    kind: str
    metadata: dict[str, str]  # the ONNX model's metadata (``character``: the classes)
    max_width: int | None  # the widest batch it takes (a TensorRT profile's); None: any

    def run(self, x: F32Array) -> tuple[IntArray, F32Array]:
        """``x``: ``[N, 3, 48, W]`` → arg-max class ``(N, T)`` and its probability."""
        ...

    def describe(self) -> dict[str, Any]: ...


class OnnxRuntimeRecogniser:
    """The recogniser in ONNX Runtime (CPU by default)."""

    kind = "onnxruntime"
    max_width: int | None = None

    def __init__(self, path: Path, threads: int = 0) -> None:
        import onnxruntime as ort

        self.threads = threads or (os.cpu_count() or 1)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT's exceptions share no public base class
            raise ModelError(f"ONNX Runtime could not load the recogniser {path}: {e}") from e
        self.input_name = self.session.get_inputs()[0].name
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)

    def run(self, x: F32Array) -> tuple[IntArray, F32Array]:
        try:
            probs = np.asarray(self.session.run(None, {self.input_name: x})[0])
        except Exception as e:  # ORT's exceptions share no public base class
            raise ModelError(f"ONNX Runtime failed on a {x.shape} recogniser batch: {e}") from e
        idx = probs.argmax(axis=2)
        best = np.take_along_axis(probs, idx[..., None], axis=2)[..., 0]
        return idx.astype(np.int64), best.astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "threads": self.threads}


class TorchRecogniser:
    """The recogniser through the torch engine's ONNX converter, on ``device``.

    FP16 on CUDA when ``fp16``; eager (widths vary per batch, so no CUDA graphs). The
    arg-max runs on the device."""

    kind = "torch"
    max_width: int | None = None

    def __init__(self, path: Path, device: str = "cuda:0", fp16: bool = True) -> None:
        import torch

        # Optional dependency: torch / TensorRT load only when this runner is asked for.
        from ..engines.onnx_torch import OnnxGraphModule

        self._torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ModelError(f"read on torch device {device}, but CUDA is not available")
        self.dtype = torch.float16 if (fp16 and self.device.type == "cuda") else torch.float32
        module = OnnxGraphModule(path, self.dtype)
        self.module = module.to(self.device).eval()
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        self.metadata = {p.key: p.value for p in model.metadata_props}

    def run(self, x: F32Array) -> tuple[IntArray, F32Array]:
        torch = self._torch
        with torch.inference_mode():
            t = torch.from_numpy(x).to(self.device, self.dtype, non_blocking=False)
            probs = self.module(t)[0].float()
            best, idx = probs.max(dim=2)
            return idx.cpu().numpy().astype(np.int64), best.cpu().numpy().astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": str(self.device), "dtype": str(self.dtype)}


def load_recogniser(
    path: Path | None,
    kind: str,
    *,
    threads: int = 0,
    device: str = "cuda:0",
    fp16: bool = True,
    config: Config | None = None,
) -> Recogniser:
    """The recogniser on engine kind ``kind`` (``onnxruntime``, ``torch`` or ``tensorrt``:
    the plan per ``config``'s ``engine.tensorrt`` and ``read`` sections, ONNX Runtime with
    a warning when TensorRT, the GPU or the plan cannot be had)."""
    model = path or default_recogniser_path()
    if not model.is_file():
        raise ModelError(f"recogniser model {model} does not exist")
    if kind == "torch":
        return TorchRecogniser(model, device, fp16)
    if kind == "tensorrt":
        # Optional dependency: torch / TensorRT load only when this runner is asked for.
        from ..engines.tensorrt.recogniser import TensorRTRecogniser

        try:
            return TensorRTRecogniser(model, config or Config())
        except EngineError as e:
            log.warning("the recogniser runs on ONNX Runtime on the CPU: TensorRT: %s", e)
            return OnnxRuntimeRecogniser(model, threads)
    if kind == "onnxruntime":
        return OnnxRuntimeRecogniser(model, threads)
    raise ModelError(f"unknown read engine {kind!r}; known: onnxruntime, torch, tensorrt")
