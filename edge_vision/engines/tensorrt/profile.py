"""The optimisation profile of a plan: MIN/OPT/MAX of batch, height and width.

Plain code, tested on CPUs (tests/integration/test_trt_plan.py): :func:`derive_profile` makes the
profile (TensorRT ``IOptimizationProfile``) from the model's input limits and the config,
so every shape :func:`edge_vision.model.shape.choose_input_shape` can pick lies inside it
(:func:`edge_vision.model.shape.side_range`, shared with it), and
:func:`calibration_shape` the fixed shape INT8 calibration runs at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ...config import TensorRTConfig
from ...errors import ConfigError, EngineError
from ...model.shape import InputLimits, choose_input_shape, side_range

#: How a plan's input lays out its batch, sides and 3 channels: ``NHWC`` for the detector's
#: uint8 frames (:func:`wrap_uint8_input`), ``NCHW`` for the recogniser's float32 crops.
Layout = Literal["NHWC", "NCHW"]


@dataclass(frozen=True, slots=True)
class ShapeProfile:
    """MIN/OPT/MAX of batch, height and width: one TensorRT optimisation profile.

    The detector's input is ``[N, H, W, 3]`` uint8 (:func:`wrap_uint8_input`), so the
    shapes given to ``IOptimizationProfile.set_shape`` are ``(N, H, W, 3)``; the
    recogniser's (``layout`` ``NCHW``, :func:`recogniser_profile`) ``(N, 3, H, W)``.
    """

    batch: tuple[int, int, int]
    height: tuple[int, int, int]
    width: tuple[int, int, int]
    layout: Layout = "NHWC"

    def __post_init__(self) -> None:
        for name, (lo, opt, hi) in (
            ("batch", self.batch),
            ("height", self.height),
            ("width", self.width),
        ):
            if not 1 <= lo <= opt <= hi:
                raise ConfigError(
                    f"TensorRT profile {name} must satisfy 1 <= min <= opt <= max, "
                    f"got {lo}/{opt}/{hi}"
                )

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(min, opt, max)`` input shapes for ``set_shape``: ``(N, H, W, 3)``, or
        ``(N, 3, H, W)`` for an ``NCHW`` profile."""
        lo, opt, hi = (self._shape(i) for i in range(3))
        return lo, opt, hi

    def _shape(self, i: int) -> tuple[int, ...]:
        n, h, w = self.batch[i], self.height[i], self.width[i]
        return (n, h, w, 3) if self.layout == "NHWC" else (n, 3, h, w)

    @property
    def static(self) -> bool:
        """True when min == opt == max for every dimension (what DLA requires)."""
        return all(lo == hi for lo, _, hi in (self.batch, self.height, self.width))

    def run_batch(self, n: int) -> int:
        """The batch actually run for ``n`` frames: padded up to the profile's minimum."""
        return max(n, self.batch[0])

    def check(self, n: int, height: int, width: int) -> None:
        """Raise EngineError unless an ``n × height × width`` batch fits the profile."""
        b = self.run_batch(n)
        if not (
            b <= self.batch[2]
            and self.height[0] <= height <= self.height[2]
            and self.width[0] <= width <= self.width[2]
        ):
            raise EngineError(
                f"a batch of {n} at {width}x{height} is outside the TensorRT profile (batch "
                f"{self.batch[0]}..{self.batch[2]}, height {self.height[0]}..{self.height[2]}, "
                f"width {self.width[0]}..{self.width[2]}); rebuild the plan for these limits"
            )

    def as_json(self) -> dict[str, list[int]]:
        lo, opt, hi = self.shapes()  # the layout shows in the shapes: (N, 3, H, W) for NCHW
        return {"min": list(lo), "opt": list(opt), "max": list(hi)}

    @classmethod
    def from_shapes(
        cls, lo: Sequence[int], opt: Sequence[int], hi: Sequence[int], layout: Layout = "NHWC"
    ) -> ShapeProfile:
        """From three ``(N, H, W, 3)`` (or, ``NCHW``, ``(N, 3, H, W)``) shapes: a JSON
        record, or an engine's profile."""
        h, w = (1, 2) if layout == "NHWC" else (2, 3)
        return cls(
            (int(lo[0]), int(opt[0]), int(hi[0])),
            (int(lo[h]), int(opt[h]), int(hi[h])),
            (int(lo[w]), int(opt[w]), int(hi[w])),
            layout,
        )


def derive_profile(
    limits: InputLimits,
    max_batch: int,
    *,
    opt_batch: int | None = None,
    opt_shape: tuple[int, int] | None = None,
    dla: bool = False,
) -> ShapeProfile:
    """The optimisation profile for a model's input limits and the engine config.

    * batch: ``1 .. max_batch``, tuned for ``opt_batch`` (default ``max_batch``: when
      several cameras keep the batcher full, that is the load that matters);
    * height and width: every side ``choose_input_shape`` can produce (``side_range``),
      tuned for ``opt_shape`` (default: the input of a 16:9 landscape frame, since most
      cameras are 16:9: 640×352 with the default model's stretch fit, 640×384 with a
      letterbox; :func:`~edge_vision.model.shape.choose_input_shape` decides, so the plan is
      tuned for the shape serving picks).

    ``dla``: TensorRT's DLA restrictions say "DLA does not support dynamic dimensions, so
    the profile's min, max, and opt values must be equal". Then every dimension must
    be static: the sides must already be (``model.min_side == model.max_side`` makes every
    frame run at one square size) and the batch is fixed at ``max_batch`` (smaller batches
    are padded; use ``engine.max_batch: 1`` for the lowest latency on DLA).
    """
    if max_batch < 1:
        raise ConfigError(f"engine.max_batch must be >= 1, got {max_batch}")
    lo, hi = side_range(limits)
    if dla:
        if lo != hi:
            raise ConfigError(
                "a DLA plan needs static input shapes (TensorRT: DLA does not support dynamic "
                f"dimensions), but model.min_side/max_side allow {lo}..{hi}; set both to one "
                "value (e.g. model.min_side: 640, model.max_side: 640) so every frame runs at "
                "that square size"
            )
        return ShapeProfile((max_batch, max_batch, max_batch), (lo, lo, lo), (lo, lo, lo))
    ob = max_batch if opt_batch is None else opt_batch
    if not 1 <= ob <= max_batch:
        raise ConfigError(
            f"engine.tensorrt.opt_batch must lie in 1..engine.max_batch ({max_batch}), got {ob}"
        )
    if opt_shape is None:
        oh, ow = choose_input_shape(1920, 1080, limits)  # (height, width) of a 16:9 frame
    else:
        oh, ow = opt_shape
        for name, side in (("height", oh), ("width", ow)):
            if not lo <= side <= hi or side % limits.stride:
                raise ConfigError(
                    f"engine.tensorrt.opt_shape {name} {side} must be a multiple of "
                    f"{limits.stride} within {lo}..{hi} (model.min_side/max_side)"
                )
    return ShapeProfile((1, ob, max_batch), (lo, oh, hi), (lo, ow, hi))


def profile_for(limits: InputLimits, max_batch: int, tcfg: TensorRTConfig) -> ShapeProfile:
    """:func:`derive_profile` with the ``engine.tensorrt`` settings."""
    return derive_profile(
        limits,
        max_batch,
        opt_batch=tcfg.opt_batch,
        opt_shape=tcfg.opt_shape,
        dla=tcfg.dla_core is not None,
    )


def recogniser_profile(
    max_batch: int, max_width: int, *, height: int = 48, min_width: int = 320
) -> ShapeProfile:
    """The text recogniser's profile (``NCHW`` float32 crops, :mod:`edge_vision.frames.read`):
    batches of ``1..max_batch`` (``read.batch``), tuned for a full one; the fixed input
    height (48); widths from the nominal ``min_width`` (320: no batch is narrower,
    :func:`edge_vision.frames.read.batch_width`) to ``max_width`` (``read.max_width``), tuned for
    the nominal width, the width of most label crops."""
    if max_batch < 1:
        raise ConfigError(f"read.batch must be >= 1, got {max_batch}")
    if max_width < min_width:
        raise ConfigError(f"read.max_width must be >= {min_width}, got {max_width}")
    return ShapeProfile(
        (1, max_batch, max_batch),
        (height, height, height),
        (min_width, min_width, max_width),
        "NCHW",
    )


def calibration_shape(profile: ShapeProfile, batch: int) -> tuple[int, int, int]:
    """``(batch, H, W)`` of INT8 calibration batches: the profile's OPT sides.

    TensorRT calibrates a network with dynamic shapes at one fixed shape (the calibration
    profile's OPT; ``IBuilderConfig.set_calibration_profile``), so every calibration frame
    is fitted (stretched or letterboxed, as serving does) to the sides the plan is tuned
    for. The batch is capped by the profile.
    """
    b = min(max(1, batch), profile.batch[2])
    b = max(b, profile.batch[0])
    return b, profile.height[1], profile.width[1]
