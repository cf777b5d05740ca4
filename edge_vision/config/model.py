"""The model's sections: ``model`` and its DB head's ``model.dbnet``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from .base import _Section


class DbnetConfig(_Section):
    """DB post-processing (Liao et al., Real-time Scene Text Detection with DB, 2020)."""

    bin_threshold: float = Field(0.3, gt=0, lt=1, description="Probability map binarisation.")
    unclip_ratio: float = Field(1.6, gt=0, description="Box expansion: area * ratio / perimeter.")
    max_candidates: int = Field(1000, ge=1, description="Contours examined per frame.")
    min_size: float = Field(3.0, ge=0, description="Shortest box side kept, input pixels.")
    dilate: bool = Field(
        True,
        description="Dilate the binarised map with a 2x2 kernel before finding contours, as "
        "the reference pipeline does: joins small text that a thin gap splits.",
    )
    max_height_fraction: float = Field(
        0.9,
        gt=0,
        description="Drop a box whose text height (short side, after unclip) is more than "
        "this fraction of the frame's short side: the model's whole-image response to "
        "textless photos, not text (docs/results.md).",
    )


class ModelConfig(_Section):
    path: Path | None = Field(
        None, description="ONNX model; none means the embedded PP-OCRv6 text detector."
    )
    preset: Literal["auto", "ppocr_det", "yolo"] = Field(
        "auto",
        description="Pre-processing preset: ppocr_det (BGR, (x/255-0.5)/0.5), yolo (RGB, x/255).",
    )
    head: Literal["auto", "dbnet", "yolo_v5", "yolo_v8", "end_to_end", "efficient_nms"] = Field(
        "auto", description="Output decoder; auto picks it from the model's output shapes."
    )
    labels: list[str] | None = Field(
        None, description="Class names; default from the model's metadata."
    )
    input_size: int = Field(
        640, ge=32, description="Target long side of the engine input, before stride rounding."
    )
    input_sizes: list[int] = Field(
        default_factory=lambda: [640, 960, 1280],
        description="Long sides a session may choose instead (settings.input_size, since "
        "protocol 2): a small set, so batches, CUDA graphs and TensorRT profiles stay "
        "bounded. Sizes above max_side are not offered; with engine.kind tensorrt neither "
        "are sizes above input_size (the plan's profile ends there). docs/results.md "
        "gives agreement and CPU frames/s per size.",
    )
    fit: Literal["letterbox", "stretch", "preset"] = Field(
        "preset",
        description="How a frame fills the engine input: letterbox (aspect kept, sides rounded "
        "up to the stride, padded), stretch (sides rounded to the nearest stride multiple, "
        "frame resized to fill it, as PP-OCR's own DetPreProcess) or preset (the model "
        "family's own: stretch for ppocr_det, letterbox for yolo; the default). "
        "docs/results.md: on 16:9 frames stretch matches the reference pipeline's boxes "
        "1.000/1.000, letterbox 0.90-0.94/0.83-0.90.",
    )
    stride: int = Field(32, ge=1, description="Input sides are multiples of this.")
    min_side: int = Field(32, ge=1, description="Smallest input side the engine accepts.")
    max_side: int = Field(1280, ge=32, description="Largest input side the engine accepts.")
    confidence: float = Field(
        0.5, ge=0, le=1, description="Default score threshold; sessions may change theirs."
    )
    nms_iou: float = Field(0.45, gt=0, le=1, description="IoU above which NMS suppresses a box.")
    max_detections: int = Field(300, ge=1, description="Detections kept per frame.")
    dbnet: DbnetConfig = Field(default_factory=DbnetConfig)
