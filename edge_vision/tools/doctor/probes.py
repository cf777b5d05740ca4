"""What the doctor's checks share: the verdicts and their limits, JetPack from L4T, the
comparison of an engine's output with ONNX Runtime's, one frame served end to end, and
what torch says of the GPU."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...config import Config

log = logging.getLogger(__name__)

PASS, FAIL, INFO, NA = "pass", "fail", "info", "not available"
U8Array = npt.NDArray[np.uint8]

#: Relative error ‖engine − ONNX Runtime‖ / ‖ONNX Runtime‖ of the raw output allowed per
#: precision (tests/gpu measured FP16 at about 1e-3 on camera-like frames). INT8 is judged
#: by its detections (the INT8 gate), its raw error only reported.
REL_ERROR_LIMIT = {"fp32": 1e-3, "fp16": 1e-2, "int8": math.inf}
#: Detections of the engine under test must match ONNX Runtime's this well (IoU >= 0.5).
MIN_AGREEMENT = 0.95

#: The batch size of the throughput measurement on GPU engines (at least; more if configured).
GPU_BATCH = 8

#: L4T release -> JetPack (NVIDIA's JetPack archive); longest prefix wins.
L4T_TO_JETPACK = {
    "36.4.4": "6.2.1",
    "36.4.3": "6.2",
    "36.4": "6.1",
    "36.3": "6.0",
    "36.2": "6.0 DP",
    "35.6": "5.1.4",
    "35.5": "5.1.3",
    "35.4": "5.1.2",
    "35.3": "5.1.1",
    "35.2": "5.1",
    "35.1": "5.0.2",
}


@dataclass
class Check:
    name: str
    status: str  # pass | fail | info | not available
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        summary = f"{NA}: {self.summary}" if self.status == NA else self.summary
        return f"{self.status.upper() if self.status != NA else 'N/A':<5} {self.name:<34} {summary}"


# -- pure helpers (unit-tested with literal inputs) ---------------------------------------


def parse_l4t_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 3.0, ...`` -> ``36.3.0``; None when not that format."""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def jetpack_for_l4t(l4t: str) -> str | None:
    for prefix in sorted(L4T_TO_JETPACK, key=len, reverse=True):
        if l4t == prefix or l4t.startswith(prefix + "."):
            return L4T_TO_JETPACK[prefix]
    return None


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ over the whole array, in float64."""
    ref64 = ref.astype(np.float64)
    norm = float(np.linalg.norm(ref64))
    diff = float(np.linalg.norm(got.astype(np.float64) - ref64))
    return diff / norm if norm else (0.0 if diff == 0 else float("inf"))


def short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def compare_with_reference(
    name: str, got: dict[str, Any], ref: dict[str, Any], precision: str
) -> Check:
    """The engine under test against ONNX Runtime: raw output error and detections."""
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...common.agreement import match_detections

    got_raw, ref_raw = got["raw"], ref["raw"]
    if got_raw.dtype == np.uint8:  # DB's byte map, made on the GPU (engine.torch.device_post)
        got_raw, ref_raw = _as_byte_maps(got_raw, ref_raw, got["byte_map_threshold"])
    # YOLO NMS'd on the device (engine.torch.device_post: its best anchors, kept or not)
    # cannot be matched element by element: the detections are the comparison.
    err = relative_error(got_raw, ref_raw) if got_raw.shape == ref_raw.shape else None
    agreement = match_detections(ref["detections"], got["detections"], iou_threshold=0.5)
    limit = REL_ERROR_LIMIT.get(precision, 1e-2)
    details = {
        "precision": precision,
        "relative_error": err,
        "relative_error_limit": limit if limit != math.inf else None,
        "agreement": agreement.as_dict(),
        "engine": got["engine"],
        "frame_ms": got["frame_ms"],
        "jpeg_decoder": got.get("jpeg_decoder"),
        "gpu_jpeg_decoder": got.get("gpu_jpeg_decoder"),
    }
    ok = (err is None or err <= limit) and agreement.score >= MIN_AGREEMENT
    if err is None:
        raw = (
            f"{precision}: NMS on the device, best {got_raw.shape[-2]} anchors of "
            f"{ref_raw.shape[-1]} back"
        )
    else:
        raw = f"{precision}: relative error {err:.2e}" + (
            f" (limit {limit:g})" if limit != math.inf else ""
        )
    summary = (
        raw
        + f"; detections {agreement.describe()}"
        + (f"; GPU JPEG decoder {got['gpu_jpeg_decoder']}" if got.get("gpu_jpeg_decoder") else "")
    )
    # engine.torch.compile: did inductor compile the warm-up shapes here (on a Jetson it
    # needs Triton for the board)? A shape that failed runs uncompiled, which serves but
    # is not what was asked for.
    compile_mode = got["engine"].get("compile", "off")
    if compile_mode != "off":
        n = got["engine"].get("compiled_shapes", 0)
        summary += f"; torch compile {compile_mode}: {n} shape(s) compiled"
        if not n:
            ok = False
            summary += " (none: the engine runs its interpreter; the log says why)"
    return Check(name, PASS if ok else FAIL, summary, details)


def _as_byte_maps(got: np.ndarray, ref: np.ndarray, threshold: float) -> tuple[Any, Any]:
    """The engine's byte map and ONNX Runtime's float map made a byte map the same way,
    both read back as probabilities: what differs is then the engine's own arithmetic (a
    pixel whose value crossed a step), not the byte map's rounding."""
    import torch

    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...model.device_post import db_map_bytes, db_map_levels

    levels = db_map_levels(threshold)
    ref_bytes = db_map_bytes(torch, torch.from_numpy(np.ascontiguousarray(ref)), threshold)
    return levels[got], levels[ref_bytes.numpy()]


async def serve_one_frame(config: Config, bgr: U8Array, jpeg: bytes) -> dict[str, Any]:
    """One engine, one real frame: its raw output on the letterboxed frame and the
    detections the service answers for the JPEG (decoder, letterbox, engine, head)."""
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...common.messages import FrameMessage
    from ...frames.infer import InferenceService
    from ...frames.pipeline import FramePipeline, FrameSettings
    from ...model.shape import letterbox_into, plan_for_frame
    from ...model.spec import load_model_spec

    spec = await asyncio.to_thread(load_model_spec, config.model)
    lb = plan_for_frame(bgr.shape[1], bgr.shape[0], spec.limits)
    config.engine.warmup_shapes = [(lb.shape[0], lb.shape[1])]
    boxed = np.empty((*lb.shape, 3), np.uint8)
    letterbox_into(bgr, lb, boxed, spec.pad_value)
    service = InferenceService(spec, config)
    await service.start()
    pipeline = FramePipeline(config, service)
    try:
        engine = service.engine
        if engine is None:
            raise RuntimeError("the engine did not start")
        raw = (await engine.infer([boxed]))[0][0]
        t0 = time.perf_counter()
        result = await pipeline.process(
            FrameMessage(0, 0.0, jpeg, False, time.perf_counter()),
            FrameSettings(config.model.confidence),
        )
        frame_ms = (time.perf_counter() - t0) * 1000
        device_decoder = getattr(getattr(pipeline, "decoding", None), "device", None)
        return {
            "raw": np.asarray(raw),
            "byte_map_threshold": config.model.dbnet.bin_threshold,
            "detections": np.asarray(result.detections),
            "input": f"{lb.shape[1]}x{lb.shape[0]}",
            "frame_ms": frame_ms,
            "engine": engine.describe(),
            "jpeg_decoder": type(pipeline.decoder).__name__,
            "gpu_jpeg_decoder": getattr(device_decoder, "name", None),
        }
    finally:
        await pipeline.close()
        await service.close()


def mps_pipe_dir(env: Mapping[str, str]) -> Path | None:
    """The pipe directory of a running MPS control daemon (``CUDA_MPS_PIPE_DIRECTORY``, by
    default /tmp/nvidia-mps), when its ``control`` FIFO is there; CUDA clients started
    with the same environment join it. None: no MPS."""
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    control = pipe / "control"
    try:
        return pipe if stat.S_ISFIFO(control.stat().st_mode) else None
    except OSError:
        return None


def cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def torch_gpu(details: dict[str, Any], reasons: list[str]) -> str | None:
    why = torch_cuda_problem()
    if why is not None:
        reasons.append(f"torch: {why}")
        return None
    import torch

    props = torch.cuda.get_device_properties(0)
    details.update(
        gpu=props.name,
        sm=f"{props.major}{props.minor}",
        multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
    )
    return str(props.name)


def torch_cuda_problem() -> str | None:
    """None when torch sees a CUDA GPU; otherwise why not."""
    try:
        import torch
    except ImportError as e:
        return short_error(e)
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return None
