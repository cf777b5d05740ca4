"""The INT8 accuracy gate: an INT8 plan is used only if its detections agree with FP32's.

INT8 calibration can go wrong quietly (frames unlike the site, a layer that quantises
badly): the plan builds and runs, and finds fewer boxes. So after an INT8 build the new
plan runs on *held-back* calibration frames — frames of the same source that calibration
did not use — and its detections are matched against ONNX Runtime's on the CPU (the
model as exported) with :func:`edge_vision.common.agreement.match_detections`, pooled over the
frames. Under ``engine.tensorrt.int8_min_agreement`` (the lower of recall and precision,
at IoU >= :data:`GATE_IOU`) the plan is refused with the figures, the refusal is remembered
beside the plans (``<stem>.int8-refused.json``, so the next start does not rebuild and
refuse again for minutes) and the FP16 plan is found or built and used instead; the log
says so. ``build-engine --force`` tries INT8 again.

:func:`judge` is plain code over detections; :func:`check_int8_plan` runs the engines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...common.agreement import Agreement, match_detections
from ...config import Config
from ...errors import EdgeVisionError, EngineError
from ...model.heads import Head, choose_head
from ...model.shape import plan_letterbox
from ...model.spec import ModelSpec
from .. import create_engine
from .calibration import calibration_frames
from .plan_store import PlanKey, PlanRecord, write_cache_atomically, write_plan_atomically
from .profile import calibration_shape

log = logging.getLogger(__name__)

F32Array = npt.NDArray[np.float32]
U8Array = npt.NDArray[np.uint8]

#: Boxes of the two engines are the same detection at this overlap or more.
GATE_IOU = 0.5


@dataclass(frozen=True)
class GateVerdict:
    accepted: bool
    agreement: Agreement
    min_agreement: float
    frames: int
    held_back: bool  # the frames were not among those calibration used

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "min_agreement": self.min_agreement,
            "agreement": round(self.agreement.score, 4),
            "frames": self.frames,
            "held_back": self.held_back,
            **self.agreement.as_dict(),
            "summary": self.summary(),
        }

    def summary(self) -> str:
        verdict = "accepted" if self.accepted else "REFUSED"
        where = "held-back" if self.held_back else "calibration (none held back)"
        return (
            f"INT8 {verdict}: agreement {self.agreement.score:.3f} "
            f"(min {self.min_agreement:g}) with ONNX Runtime on {self.frames} {where} frames; "
            f"{self.agreement.describe()}"
        )


def judge(
    reference: Sequence[F32Array],
    candidate: Sequence[F32Array],
    min_agreement: float,
    iou_threshold: float = GATE_IOU,
    held_back: bool = True,
) -> GateVerdict:
    """Pool the per-frame matching of ``candidate`` against ``reference`` detections."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference frames but {len(candidate)} candidate")
    total = Agreement(0, 0, 0, iou_threshold, 1.0)
    for ref, cand in zip(reference, candidate, strict=True):
        total = total + match_detections(ref, cand, iou_threshold)
    return GateVerdict(
        total.score >= min_agreement, total, min_agreement, len(reference), held_back
    )


# -- the refusal, remembered beside the plans --------------------------------------------


def refusal_path(engine_dir: Path, key: PlanKey) -> Path:
    return engine_dir / f"{key.stem}.int8-refused.json"


def record_refusal(engine_dir: Path, key: PlanKey, verdict: GateVerdict) -> Path:
    path = refusal_path(engine_dir, key)
    engine_dir.mkdir(parents=True, exist_ok=True)
    data = {"key": key.digest, **verdict.as_dict()}
    write_cache_atomically(path, (json.dumps(data, indent=2) + "\n").encode())
    return path


def earlier_refusal(config: Config, key: PlanKey) -> dict[str, Any] | None:
    """The gate's figures when it refused the INT8 plan of ``key`` before and would refuse
    it again (the gate is on, and its agreement is under today's minimum); else None."""
    minimum = config.engine.tensorrt.int8_min_agreement
    if key.precision != "int8" or minimum <= 0:
        return None
    path = refusal_path(config.engine.tensorrt.engine_dir, key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key.digest:
        return None
    if float(data.get("agreement", 0.0)) >= minimum:
        return None  # the minimum was lowered since: build and judge INT8 again
    return data


def fp16_config(config: Config) -> Config:
    """The same settings with FP16 precision (the plan to use when INT8 is refused)."""
    fp16 = config.model_copy(deep=True)
    fp16.engine.tensorrt.precision = "fp16"
    fp16.engine.tensorrt.calibration_source = None
    return fp16


def log_fallback(summary: str, refusal: Path | None = None) -> None:
    where = f" (recorded in {refusal}; build-engine --force tries INT8 again)" if refusal else ""
    log.warning("%s; falling back to the FP16 plan%s", summary, where)


# -- running the engines -----------------------------------------------------------------


def gate_frames(config: Config, spec: ModelSpec, key: PlanKey) -> tuple[list[U8Array], bool]:
    """Frames of the calibration source that calibration did not use (and whether they
    really are held back: a source with no frames to spare gives calibration frames)."""
    tcfg = config.engine.tensorrt
    if tcfg.calibration_source is None:
        raise ValueError("the INT8 gate needs engine.tensorrt.calibration_source")
    _, h, w = calibration_shape(key.profile, tcfg.calibration_batch)
    wanted = tcfg.calibration_frames + tcfg.int8_gate_frames
    frames = list(
        calibration_frames(
            tcfg.calibration_source, h, w, spec.pad_value, wanted, fit=spec.limits.fit
        )
    )
    held = frames[tcfg.calibration_frames :]
    if held:
        return held, True
    return frames[-tcfg.int8_gate_frames :], False


def check_int8_plan(
    spec: ModelSpec, config: Config, key: PlanKey, plan: bytes, record: PlanRecord
) -> GateVerdict:
    """Run the just-built INT8 ``plan`` and ONNX Runtime on the gate frames; judge.

    Blocking (engines start and run on an event loop of its own): call it where the
    build runs, a worker thread or the CLI's main thread."""
    tcfg = config.engine.tensorrt
    frames, held_back = gate_frames(config, spec, key)
    with tempfile.TemporaryDirectory(prefix="int8-gate-") as folder:
        # The plan is not in engine_dir yet (a refused plan never is): run it from here.
        write_plan_atomically(Path(folder), key, plan, record)
        candidate_cfg = config.model_copy(deep=True)
        candidate_cfg.engine.tensorrt.engine_dir = Path(folder)
        candidate_cfg.engine.tensorrt.build_if_missing = False
        candidate = asyncio.run(detections_of("tensorrt", spec, candidate_cfg, frames))
    reference = asyncio.run(detections_of("onnxruntime", spec, config, frames))
    return judge(reference, candidate, tcfg.int8_min_agreement, GATE_IOU, held_back)


async def detections_of(
    kind: str, spec: ModelSpec, config: Config, frames: Sequence[U8Array]
) -> list[F32Array]:
    """Each letterboxed frame's detections (frame = model input, no letterbox to undo)."""
    engine = create_engine(kind, spec, config)
    await engine.start()
    try:
        h, w = frames[0].shape[:2]
        lb = plan_letterbox(w, h, h, w)
        m = config.model
        out: list[F32Array] = []
        head: Head | None = None
        for i in range(0, len(frames), engine.max_batch):
            batch = list(frames[i : i + engine.max_batch])
            outputs = await engine.infer(batch)
            if head is None:
                head = choose_head(spec.head, [tuple(o.shape) for o in outputs], m)
            for j in range(len(batch)):
                out.append(head.decode([o[j] for o in outputs], lb, m.confidence))
        return out
    finally:
        await engine.close()


def run_gate(
    spec: ModelSpec, config: Config, key: PlanKey, plan: bytes, record: PlanRecord
) -> GateVerdict | None:
    """The gate for a just-built plan: None unless it is INT8 with the gate on. The
    figures go into the plan's record (``extra.int8_gate``)."""
    tcfg = config.engine.tensorrt
    if key.precision != "int8" or tcfg.int8_min_agreement <= 0:
        return None
    try:
        verdict = check_int8_plan(spec, config, key, plan, record)
    except (EdgeVisionError, OSError, ValueError) as e:
        raise EngineError(f"the INT8 accuracy gate could not run: {e}") from e
    record.extra["int8_gate"] = verdict.as_dict()
    (log.info if verdict.accepted else log.warning)("%s", verdict.summary())
    return verdict
