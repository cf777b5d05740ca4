"""What the frame path hands back for one frame: :class:`FrameResult`, a plain type.

It lives apart from :mod:`edge_vision.frames.pipeline` (cv2, numpy, the engines, the batcher) so
that the modules that only carry or serialise results — :mod:`edge_vision.session.reply`, the
session core — import none of that. The types named in the annotations are imported for
type checking only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ..common.messages import FrameMessage
    from .read import ReadText


@dataclass(slots=True)
class FrameResult:
    frame: FrameMessage
    width: int
    height: int
    detections: npt.NDArray[np.float32]  # (N, 6): x1, y1, x2, y2, score, class, frame px
    timing: dict[str, float]  # milliseconds per stage, plus batch size
    # Since protocol 2, with reading on (read.py): one per detection, None when not read.
    texts: list[ReadText | None] | None = None
