"""Post-processing a GPU engine runs on the device, inside its captured graph, so that less
crosses back to the host: DB's probability map as one byte a pixel, and YOLO v8/v11's NMS.
Each takes the ``torch`` module as an argument, so this module imports no torch; the host
heads that read their outputs are in :mod:`.heads`."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]

#: Rounds of :func:`yolo_v8_device_nms`'s fixed-point iteration inside the captured graph.
DEVICE_NMS_ROUNDS = 8
#: What :func:`yolo_v8_device_nms` says of each candidate: suppressed or kept; undecided
#: (every candidate of the frame) when its rounds did not settle, and the host runs NMS.
NMS_SUPPRESSED, NMS_KEPT, NMS_UNDECIDED = 0, 1, 2


def yolo_v8_device_nms(
    torch: Any, raw: Any, k: int, iou_threshold: float, rounds: int = DEVICE_NMS_ROUNDS
) -> list[Any]:
    """A YOLO v8/v11 raw output ``[B, 4 + nc, A]`` NMS'd on the device, inside the torch
    engine's captured graph (``engine.torch.device_post``; static shapes, no host sync):

    1. the ``k`` anchors with the highest class score, highest first, ties in anchor
       order (every anchor left
       out scores below every anchor kept, so the detections are the host's whenever at
       most ``k`` anchors reach the confidence threshold);
    2. their boxes as x1, y1, x2, y2, and which earlier candidate of the same class
       overlaps which later one by more than ``iou_threshold`` (``[B, k, k]``, made a
       frame at a time to bound the graph's memory);
    3. greedy NMS as a fixed point (Zheng et al., "Enhancing Geometric Factors in Model
       Learning and Inference", 2021, Cluster-NMS): ``keep[j]`` = no kept earlier
       candidate overlaps ``j``. Starting from all kept, each round applies that rule to
       the last; a round that changes nothing has reached greedy NMS's own answer, so
       ``rounds`` rounds run and the last two are compared. A frame whose rounds did not
       settle is marked undecided and the host runs greedy NMS on its candidates.

    Returns ``[dets [B, k, 6] float32 (x1, y1, x2, y2, score, class; highest first),
    state [B, k] uint8 (NMS_SUPPRESSED / NMS_KEPT / NMS_UNDECIDED)]``: 25 bytes a
    candidate instead of ``4 * (4 + nc)`` (336 at 80 classes), and no NMS on the host.
    The confidence threshold is each session's own, so it is left to the host: a
    candidate under it can only suppress lower-scoring ones, under it too, so filtering
    after NMS keeps what filtering before it would. ``torch``: the module, passed in, so
    this module imports no torch."""
    if rounds < 1:
        raise ValueError(f"device NMS needs at least one round, not {rounds}")
    b, _, a = raw.shape
    k = min(k, a)
    scores, classes = raw[:, 4:, :].max(dim=1)
    # Highest first, ties in anchor order as the host's stable sort has them (topk leaves
    # ties in any order, and FP16 scores tie often): which of two tied, overlapping boxes
    # is kept is then the host's choice too.
    scores, index = scores.sort(dim=1, descending=True, stable=True)
    scores, index = scores[:, :k], index[:, :k]
    classes = classes.gather(1, index).to(raw.dtype)
    xywh = raw[:, :4, :].gather(2, index.unsqueeze(1).expand(b, 4, k)).transpose(1, 2)
    half = xywh[..., 2:] / 2
    boxes = torch.cat([xywh[..., :2] - half, xywh[..., :2] + half], dim=2)
    # Which candidate suppresses which, a frame at a time: the float pairs of one frame are
    # [k, k] (4 MB at k = 1,024), not the batch's 16x that, in the graph's memory pool.
    later = torch.ones(k, k, dtype=torch.bool, device=raw.device).triu(1)
    over = torch.stack(
        [_suppresses(torch, boxes[i], classes[i], iou_threshold) & later for i in range(b)]
    )
    keep = torch.ones(b, k, dtype=torch.bool, device=raw.device)
    before = keep
    for _ in range(rounds):
        before, keep = keep, ~(over & keep.unsqueeze(2)).any(dim=1)
    settled = (keep == before).all(dim=1, keepdim=True)
    undecided = torch.full_like(keep, NMS_UNDECIDED, dtype=torch.uint8)
    state = torch.where(settled, keep.to(torch.uint8), undecided)
    dets = torch.cat([boxes, scores.unsqueeze(2), classes.unsqueeze(2)], dim=2)
    return [dets, state]


def _suppresses(torch: Any, boxes: Any, classes: Any, iou_threshold: float) -> Any:
    """``[k, k]`` bool: candidates ``i`` and ``j`` (x1, y1, x2, y2 ``[k, 4]``) are of one
    class and overlap by more than ``iou_threshold``, as :func:`nms` on the host decides."""
    x1, y1, x2, y2 = (c.unsqueeze(1) for c in boxes.unbind(1))  # [k, 1] each
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)

    def overlap(lo: Any, hi: Any) -> Any:  # [k, k]: each pair's overlap along one axis
        return (torch.minimum(hi, hi.T) - torch.maximum(lo, lo.T)).clamp_(min=0)

    inter = overlap(x1, x2).mul_(overlap(y1, y2))
    union = (area + area.T).sub_(inter).clamp_(min=1e-9)
    over = inter.div_(union) > iou_threshold
    return over & (classes.unsqueeze(1) == classes.unsqueeze(0))


#: The byte map of DB's probabilities that a GPU engine returns instead of the float map
#: (``engine.torch.device_post``; made on the device by :func:`db_map_bytes`, one
#: byte a pixel, so 4x less to copy back and no threshold pass on the host). With ``t`` the
#: binarisation threshold, a pixel above ``t`` is ``128 + round((p - t) / (1 - t) · 127)``,
#: any other ``round(p / t · 127)``: the top bit is the bitmap, exactly as ``p > t`` is on
#: the host, and the rest gives the box score back within ``(1 - t) / 254`` (0.0028 at 0.3).
DB_MAP_BYTES = 127


@functools.lru_cache(maxsize=8)
def db_map_levels(threshold: float) -> F32Array:
    """The probability each byte of :data:`DB_MAP_BYTES` stands for (256 float32)."""
    q = np.arange(256, dtype=np.float64)
    low = q / DB_MAP_BYTES * threshold
    high = threshold + (q - 128) / DB_MAP_BYTES * (1.0 - threshold)
    return np.where(q >= 128, high, low).astype(np.float32)


def db_map_bytes(torch: Any, prob: Any, threshold: float) -> Any:
    """DB's float probability map as its byte map (:data:`DB_MAP_BYTES`), made on the
    device (``torch``: the module, passed in, so this module imports no torch):
    the top bit is ``prob > threshold``, the low seven the probability within its half."""
    above = prob > threshold
    high = 128.0 + torch.round((prob - threshold) * (DB_MAP_BYTES / (1.0 - threshold)))
    low = torch.round(prob.clamp(0.0, threshold) * (DB_MAP_BYTES / threshold))
    return torch.where(above, high.clamp(128, 255), low.clamp(0, 127)).to(torch.uint8)
