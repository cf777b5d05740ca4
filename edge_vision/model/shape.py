"""Stage 4, shape: per-frame engine input size, letterbox, normalise. Pure functions.

The engine input follows the frame's aspect ratio: the long side goes to the target
(``model.input_size``), both sides are rounded to the stride and clamped to the engine's
optimisation profile, so a 16:9 frame runs at 640×352 (stretch) or 640×384 (letterbox)
instead of 640×640.
How the frame fills that input is the model's *fit* (:attr:`InputLimits.fit`, set per
model preset in spec.py):

* ``letterbox`` (YOLO's): sides rounded *up*; the frame resized keeping its aspect ratio
  and centred, the rest padded;
* ``stretch`` (PP-OCR's ``DetPreProcess``, the default text detector's): sides rounded to
  the *nearest* multiple of the stride (a 1280×720 frame at 1280 runs at 1280×704) and the
  frame resized to fill the input, each axis by its own scale.

Either way :class:`Letterbox` remembers the exact per-axis scale and padding (none for a
stretch), so boxes map back to frame pixels exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

U8Array = npt.NDArray[np.uint8]
F32Array = npt.NDArray[np.float32]

Fit = Literal["letterbox", "stretch"]


@dataclass(frozen=True, slots=True)
class InputLimits:
    """What the engine accepts: target long side, stride and the profile's side range;
    and how a frame fills the input (``fit``: see the module docstring)."""

    target: int = 640
    stride: int = 32
    min_side: int = 32
    max_side: int = 1280
    fit: Fit = "letterbox"

    def __post_init__(self) -> None:
        if self.min_side > self.max_side:
            raise ValueError(f"min_side {self.min_side} > max_side {self.max_side}")
        if self.stride <= 0 or self.target <= 0:
            raise ValueError("stride and target must be positive")
        if self.fit not in ("letterbox", "stretch"):
            raise ValueError(f"fit must be 'letterbox' or 'stretch', not {self.fit!r}")


def _round_up(value: float, stride: int) -> int:
    return int(-(-round(value) // stride) * stride)


def _round_nearest(value: float, stride: int) -> int:
    # As PP-OCR's DetPreProcess: the scaled side truncated, then rounded half to even
    # (Python's round): 720 → 704 at stride 32, as the reference feeds the model.
    return round(int(value) / stride) * stride


def side_range(limits: InputLimits) -> tuple[int, int]:
    """Smallest and largest side :func:`choose_input_shape` can return: its clamp.

    ``model.min_side`` rounded up and ``model.max_side`` rounded down to the stride; and
    since the long side goes to the target, no side exceeds the stride-rounded target even
    when ``max_side`` allows more. The TensorRT profile spans exactly this range
    (:func:`~edge_vision.engines.tensorrt.profile.derive_profile`): a profile no larger
    keeps the execution contexts' device memory small (it is sized for the profile's
    maximum), which counts on a Jetson.
    """
    lo = _round_up(limits.min_side, limits.stride)
    hi = limits.max_side - limits.max_side % limits.stride
    top = _round_up(limits.target, limits.stride)
    return min(lo, hi), min(max(top, lo), hi)


def choose_input_shape(width: int, height: int, limits: InputLimits) -> tuple[int, int]:
    """Engine input ``(height, width)`` for a frame: aspect kept, stride-rounded (up for a
    letterbox, to the nearest for a stretch), clamped to :func:`side_range`."""
    if width <= 0 or height <= 0:
        raise ValueError("frame sides must be positive")
    scale = limits.target / max(width, height)
    lo, hi = side_range(limits)
    rnd = _round_nearest if limits.fit == "stretch" else _round_up
    h = min(max(rnd(height * scale, limits.stride), lo), hi)
    w = min(max(rnd(width * scale, limits.stride), lo), hi)
    return h, w


@dataclass(frozen=True, slots=True)
class Letterbox:
    """Where a ``src_w × src_h`` frame sits inside an ``out_w × out_h`` engine input."""

    src_w: int
    src_h: int
    out_w: int
    out_h: int
    new_w: int  # resized frame inside the canvas
    new_h: int
    pad_x: int  # left padding
    pad_y: int  # top padding

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_h, self.out_w

    def to_frame(self, boxes: F32Array) -> F32Array:
        """Map ``(N, >=4)`` x1,y1,x2,y2 boxes from input to frame pixels, clipped, in place."""
        if len(boxes):
            sx = self.new_w / self.src_w
            sy = self.new_h / self.src_h
            boxes[:, [0, 2]] = np.clip((boxes[:, [0, 2]] - self.pad_x) / sx, 0, self.src_w)
            boxes[:, [1, 3]] = np.clip((boxes[:, [1, 3]] - self.pad_y) / sy, 0, self.src_h)
        return boxes


def plan_letterbox(src_w: int, src_h: int, out_h: int, out_w: int) -> Letterbox:
    scale = min(out_w / src_w, out_h / src_h)
    new_w = min(out_w, max(1, round(src_w * scale)))
    new_h = min(out_h, max(1, round(src_h * scale)))
    return Letterbox(
        src_w, src_h, out_w, out_h, new_w, new_h, (out_w - new_w) // 2, (out_h - new_h) // 2
    )


def plan_fit(src_w: int, src_h: int, out_h: int, out_w: int, fit: Fit) -> Letterbox:
    """Where a ``src_w × src_h`` frame goes in an ``out_h × out_w`` input with ``fit``:
    a stretch fills the whole input, each axis scaled on its own; a letterbox keeps the
    aspect ratio and pads (:func:`plan_letterbox`)."""
    if fit == "stretch":
        return Letterbox(src_w, src_h, out_w, out_h, out_w, out_h, 0, 0)
    return plan_letterbox(src_w, src_h, out_h, out_w)


def plan_for_frame(width: int, height: int, limits: InputLimits) -> Letterbox:
    h, w = choose_input_shape(width, height, limits)
    return plan_fit(width, height, h, w, limits.fit)


@functools.lru_cache(maxsize=64)
def area_taps(n_in: int, n_out: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """OpenCV's ``INTER_AREA`` weights for shrinking one axis from ``n_in`` to ``n_out``
    samples: output ``i`` is ``sum_k weight[i, k] * input[index[i, k]]``, each output the
    mean of the input it covers, a partly covered input weighted by how much of it is
    covered (as cv2's ``computeResizeAreaTab`` has them). ``(n_out, K)`` arrays; unused
    taps have weight 0. The device letterbox applies them one axis after the other, as
    cv2 does, so frames shrunk by a fraction (1280x720 to 640x352) match the host's."""
    if not 0 < n_out <= n_in:
        raise ValueError(f"area taps shrink an axis: {n_in} -> {n_out}")
    scale = n_in / n_out
    rows: list[list[tuple[int, float]]] = []
    for d in range(n_out):
        f1 = d * scale
        f2 = f1 + scale
        s2 = min(math.floor(f2), n_in - 1)
        s1 = min(math.ceil(f1), s2)
        cell = min(scale, n_in - f1)
        taps: list[tuple[int, float]] = []
        if s1 - f1 > 1e-3:
            taps.append((s1 - 1, (s1 - f1) / cell))
        taps += [(s, 1.0 / cell) for s in range(s1, s2)]
        if f2 - s2 > 1e-3:
            taps.append((s2, min(f2 - s2, 1.0, cell) / cell))
        rows.append(taps)
    k = max(len(t) for t in rows)
    index = np.zeros((n_out, k), np.int64)
    weight = np.zeros((n_out, k), np.float32)
    for d, taps in enumerate(rows):
        for j, (src, w) in enumerate(taps):
            index[d, j], weight[d, j] = src, w
    return index, weight


def letterbox_into(src: U8Array, lb: Letterbox, dst: U8Array, pad_value: int) -> None:
    """Resize ``src`` (any size, same aspect as the frame) into ``dst`` (out_h × out_w × 3)."""
    if dst.shape != (lb.out_h, lb.out_w, 3):
        raise ValueError(f"dst is {dst.shape}, letterbox wants {(lb.out_h, lb.out_w, 3)}")
    y0, x0, y1, x1 = lb.pad_y, lb.pad_x, lb.pad_y + lb.new_h, lb.pad_x + lb.new_w
    region = dst[y0:y1, x0:x1]
    if src.shape[:2] == (lb.new_h, lb.new_w):
        np.copyto(region, src)
    else:
        shrinking = src.shape[1] > lb.new_w
        interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        cv2.resize(src, (lb.new_w, lb.new_h), dst=region, interpolation=interp)
    if y0:
        dst[:y0] = pad_value
    if y1 < lb.out_h:
        dst[y1:] = pad_value
    if x0:
        dst[y0:y1, :x0] = pad_value
    if x1 < lb.out_w:
        dst[y0:y1, x1:] = pad_value


@dataclass(frozen=True, slots=True)
class Normalisation:
    """``x' = (x - mean[c]) / std[c]`` per model input channel ``c`` (mean/std in that order)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rgb: bool  # the model wants RGB (channels reversed from our BGR pixels)

    def scale_shift(self) -> tuple[F32Array, F32Array]:
        """``x' = x * scale[c] + shift[c]``: ``1 / std`` and ``-mean / std`` as float32
        ``(3,)`` arrays, the one form every engine applies (on the CPU here, in the
        torch engine's graph, folded into a TensorRT plan's first layers)."""
        scale = np.asarray([1.0 / s for s in self.std], np.float32)
        shift = np.asarray([-m / s for m, s in zip(self.mean, self.std, strict=True)], np.float32)
        return scale, shift


def normalise_into(dst: F32Array, frames: list[U8Array], norm: Normalisation) -> None:
    """uint8 BGR HWC frames → float32 NCHW ``dst`` (``len(frames)`` × 3 × H × W), in place."""
    if dst.shape[0] != len(frames):
        raise ValueError("dst batch size differs from number of frames")
    scale, shift = norm.scale_shift()
    order = (2, 1, 0) if norm.rgb else (0, 1, 2)
    for i, frame in enumerate(frames):
        for c_out, c_in in enumerate(order):
            plane = dst[i, c_out]
            np.multiply(frame[:, :, c_in], scale[c_out], out=plane, casting="unsafe")
            plane += shift[c_out]
