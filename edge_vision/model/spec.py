"""Which model runs and how to feed it: the :class:`ModelSpec` every engine shares.

The embedded default is the PP-OCRv6 text detector that the ``rapidocr`` wheel ships
(Apache-2.0), found through ``importlib.resources``; nothing is downloaded. Any ONNX
model may be configured instead; Ultralytics YOLO exports are recognised by their
metadata (``names``, ``stride``, ``imgsz``), which is parsed with ``ast.literal_eval``
(never ``eval``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.resources
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..config import EngineConfig, ModelConfig
from ..errors import ModelError
from .shape import Fit, InputLimits, Normalisation

DEFAULT_MODEL_FILE = "PP-OCRv6_det_small.onnx"
# The recogniser the rapidocr wheel ships beside it (reading: edge_vision.frames.read).
DEFAULT_RECOGNISER = "PP-OCRv6_rec_small.onnx"

Preset = Literal["ppocr_det", "yolo"]

PRESETS: dict[str, tuple[Normalisation, int]] = {
    # PP-OCR det: BGR, (x / 255 - 0.5) / 0.5; pad black.
    "ppocr_det": (Normalisation((127.5,) * 3, (127.5,) * 3, rgb=False), 0),
    # Ultralytics: RGB, x / 255; pad grey 114 as its letterbox does.
    "yolo": (Normalisation((0.0,) * 3, (255.0,) * 3, rgb=True), 114),
}

# How a frame fills a dynamic-size input (shape.py) with ``model.fit: preset``, as each
# family's own pipeline does: PP-OCR's DetPreProcess stretches to the nearest multiple of
# 32 (measured: the boxes then match the reference's on 16:9 frames, docs/results.md),
# Ultralytics letterboxes.
PRESET_FIT: dict[str, Fit] = {"ppocr_det": "stretch", "yolo": "letterbox"}


def rapidocr_model(file_name: str, needed_for: str = "the default model") -> Path:
    """A model file shipped in the installed ``rapidocr`` package (its ``models/``)."""
    try:
        res = importlib.resources.files("rapidocr") / "models" / file_name
    except ModuleNotFoundError as e:
        raise ModelError(
            f"{needed_for} comes with the 'rapidocr' package: pip install rapidocr"
        ) from e
    path = Path(str(res))
    if not path.is_file():
        raise ModelError(f"rapidocr is installed but {file_name} is missing at {path}")
    return path


def default_model_path() -> Path:
    """The PP-OCRv6 detector inside the installed ``rapidocr`` package."""
    return rapidocr_model(DEFAULT_MODEL_FILE)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ModelSpec:
    """Everything about a model that pre- and post-processing and engines need."""

    name: str
    path: Path
    sha256: str
    input_name: str
    output_names: tuple[str, ...]
    normalisation: Normalisation
    pad_value: int
    limits: InputLimits
    labels: tuple[str, ...]
    head: str | None  # None: pick from output shapes after the first inference
    batch_dim: int | None = None  # the ONNX input's static batch size; None: dynamic

    def label(self, cls: int) -> str:
        return self.labels[cls] if 0 <= cls < len(self.labels) else f"class_{cls}"

    def with_head(self, head: str) -> ModelSpec:
        return replace(self, head=head)


def decide_max_batch(spec: ModelSpec, engine: EngineConfig) -> int:
    """The largest batch for this model and config, decided here once.

    ``engine.max_batch``, capped by the model input's static batch size when it has one.
    Engines start from this value and may only narrow it
    (:meth:`~edge_vision.engines.base.Engine.narrow_max_batch`: a TensorRT plan's
    profile, the max batch Triton's model accepts); the batcher, ``hello`` and
    ``/metrics`` read the engine's value, and a TensorRT profile is built for this one.
    """
    if spec.batch_dim is None:
        return engine.max_batch
    return min(engine.max_batch, spec.batch_dim)


def _parse_names(raw: str) -> tuple[str, ...]:
    try:
        names = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return ()
    if isinstance(names, dict):
        return tuple(str(names[k]) for k in sorted(names))
    if isinstance(names, list | tuple):
        return tuple(str(n) for n in names)
    return ()


def _dim(d: object) -> int | None:
    value = getattr(d, "dim_value", 0)
    return int(value) if value else None


def load_model_spec(cfg: ModelConfig) -> ModelSpec:
    """Read the configured (or default) ONNX model's I/O and metadata into a spec.

    The spec holds what the model says (and ``model.*``), nothing of ``engine.*``: the max
    batch comes from both and is :func:`decide_max_batch`'s."""
    import onnx

    path = cfg.path or default_model_path()
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and friends without a common base
        raise ModelError(f"{path} is not a readable ONNX model: {e}") from e
    graph = proto.graph
    initialisers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initialisers]
    if len(inputs) != 1:
        raise ModelError(f"{path} has {len(inputs)} inputs; edge_vision needs one image input")
    inp = inputs[0]
    dims = [_dim(d) for d in inp.type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[1] not in (3, None):
        raise ModelError(f"{path} input {inp.name} has shape {dims}; expected [N, 3, H, W]")
    meta = {p.key: p.value for p in proto.metadata_props}
    outputs = [o.name for o in graph.output]
    out_rank = [len(o.type.tensor_type.shape.dim) for o in graph.output]
    out_ch = [
        _dim(o.type.tensor_type.shape.dim[1]) if r > 1 else None
        for o, r in zip(graph.output, out_rank, strict=True)
    ]

    preset: Preset
    if cfg.preset != "auto":
        preset = cfg.preset
    elif "names" in meta or "stride" in meta:
        preset = "yolo"
    elif len(outputs) == 1 and out_rank[0] == 4 and out_ch[0] in (1, None):
        preset = "ppocr_det"  # one probability map [N, 1, H, W] (channel often symbolic)
    else:
        preset = "yolo"
    norm, pad = PRESETS[preset]

    labels: tuple[str, ...]
    if cfg.labels is not None:
        labels = tuple(cfg.labels)
    elif "names" in meta:
        labels = _parse_names(meta["names"])
    else:
        labels = ("text",) if preset == "ppocr_det" else ()

    stride = cfg.stride
    if "stride" in meta:
        try:
            stride = max(stride, int(ast.literal_eval(meta["stride"])))
        except (ValueError, SyntaxError, TypeError):
            pass
    h, w = dims[2], dims[3]
    if h is not None and w is not None:  # static spatial shape: every frame runs at it
        limits = InputLimits(target=max(h, w), stride=1, min_side=min(h, w), max_side=max(h, w))
        if h != w:
            raise ModelError(
                f"{path} has a static non-square input {h}x{w}; export it with dynamic axes"
            )
    else:
        fit = PRESET_FIT[preset] if cfg.fit == "preset" else cfg.fit
        limits = InputLimits(cfg.input_size, stride, cfg.min_side, cfg.max_side, fit)
    head = None if cfg.head == "auto" else cfg.head
    return ModelSpec(
        name=path.stem,
        path=path,
        sha256=file_sha256(path),
        input_name=inp.name,
        output_names=tuple(outputs),
        normalisation=norm,
        pad_value=pad,
        limits=limits,
        labels=labels,
        head=head,
        batch_dim=dims[0],
    )


def default_recogniser_path() -> Path:
    """The recogniser shipped in the rapidocr wheel (the default detector's own)."""
    return rapidocr_model(DEFAULT_RECOGNISER, "reading (unless read.model_path is set)")
