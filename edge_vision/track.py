"""Track ids: the same text, moved, keeps its id from frame to frame. Pure, no I/O.

One :class:`Tracker` per session. Each answered frame's detections (the ``(N, 6)``
contract, frame pixels) go through :meth:`Tracker.update` in frame order, with the
frame's time; it returns one track id per detection.

The association is ByteTrack's (Zhang et al., "ByteTrack: Multi-Object Tracking by
Associating Every Detection Box", ECCV 2022), with IoU as the only affinity:

1. every live track predicts where its box is now: its last box moved by its velocity
   (a constant-velocity estimate of each edge, smoothed over frames) times the time since
   it was last seen;
2. detections scoring at least ``high_score`` are matched first, to all tracks, by IoU of
   the predicted box, greedily best pair first, at IoU ≥ ``match_iou``;
3. the remaining, lower-scoring detections are matched to the tracks still free — a
   label that blurs or is half hidden for a frame scores lower, and this keeps its id;
4. a detection left unmatched starts a new track (every detection the service returns
   has an id: the service already dropped boxes under the session's confidence);
5. a track that is not seen is kept, coasting on its velocity, for ``keep_s`` seconds
   and at least ``keep_frames`` frames that missed it, so a label that leaves (or is
   missed) and comes back within that time gets its id back; after that it is forgotten.
   Time alone never ends a track: on a slow stream (a loaded CPU answering under 1 frame/s)
   a label seen in every frame keeps its id however far apart the frames are.

Ids count up from 1 per tracker and are never reused within a session.

Cost: the tracks are held as arrays (one row per track), so an update is a handful of
numpy operations on the (detections × tracks) IoU matrix plus a greedy pass over the
pairs that overlap enough, not Python work per track: 300 boxes take about a
millisecond (docs/results.md, ``python -m edge_vision.bench.tracker``). It runs on the
event loop, in reply order (connection.py), which keeps one session's updates in frame
order and never two at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class TrackerSettings:
    high_score: float = 0.6
    match_iou: float = 0.3
    keep_s: float = 1.0
    keep_frames: int = 3
    # Weight of the newest displacement in the velocity estimate (exponential smoothing):
    # one noisy box edge must not throw the prediction off.
    velocity_gain: float = 0.5
    # A track that coasts does not run off for ever: past this it stays where it got to.
    max_coast_s: float = 1.0


# Up to this many (box, box) pairs all are computed: cheaper than sorting for the sweep.
_DENSE_PAIRS = 1024


def overlapping_pairs(
    a: F64Array, b: F64Array, threshold: float
) -> tuple[IntArray, IntArray, F64Array]:
    """The pairs of a box in ``a`` (M, 4) and one in ``b`` (N, 4) with IoU ≥ ``threshold``
    (> 0): their rows in ``a``, rows in ``b`` and IoUs, in row-major order.

    The same pairs as thresholding the full (M, N) IoU matrix, without computing it: with
    ``b`` sorted by left edge, only the boxes whose left edge lies in
    ``(a.x1 - widest b, a.x2)`` can overlap a box of ``a`` at all (sort and sweep; or the
    same in y), and a box overlaps few others, so the cost follows the candidate pairs,
    not M × N."""
    empty = np.zeros(0, dtype=np.int64)
    if not len(a) or not len(b):
        return empty, empty, np.zeros(0)
    if len(a) * len(b) <= _DENSE_PAIRS:  # few boxes: the whole matrix
        full = _iou(a[:, None, :], b[None, :, :])
        ii, jj = np.nonzero(full >= max(threshold, 1e-9))
        return ii.astype(np.int64), jj.astype(np.int64), full[ii, jj]
    # Along x or y, whichever leaves fewer candidates (lines of a page are apart in y;
    # labels along a shelf are apart in x).
    order, lo, counts = min(
        (_sweep(a, b, axis) for axis in (0, 1)), key=lambda sw: int(sw[2].sum())
    )
    total = int(counts.sum())
    if not total:
        return empty, empty, np.zeros(0)
    ii = np.repeat(np.arange(len(a), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts  # where each row's candidates begin
    jj = order[np.repeat(lo, counts) + np.arange(total) - np.repeat(starts, counts)]
    iou = _iou(a[ii], b[jj])
    keep = iou >= max(threshold, 1e-9)
    ii, jj, iou = ii[keep], jj[keep], iou[keep]
    rm = np.lexsort((jj, ii))  # row-major, as np.nonzero of the matrix gives them
    return ii[rm], jj[rm], iou[rm]


def _iou(a: F64Array, b: F64Array) -> F64Array:
    """IoU of boxes ``a`` and ``b`` (``(..., 4)``, broadcast); 0 where the union is empty."""
    w = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    h = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    inter = np.maximum(w, 0.0) * np.maximum(h, 0.0)
    area_a = np.maximum(a[..., 2] - a[..., 0], 0.0) * np.maximum(a[..., 3] - a[..., 1], 0.0)
    area_b = np.maximum(b[..., 2] - b[..., 0], 0.0) * np.maximum(b[..., 3] - b[..., 1], 0.0)
    union = area_a + area_b - inter
    out: F64Array = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return out


def _sweep(a: F64Array, b: F64Array, axis: int) -> tuple[IntArray, IntArray, IntArray]:
    """``b``'s order along ``axis`` (0: x, 1: y) and, per box of ``a``, where its
    candidates begin in that order and how many there are."""
    order = np.argsort(b[:, axis], kind="stable")
    start = b[order, axis]
    longest = max(float(np.max(b[:, axis + 2] - b[:, axis])), 0.0)
    lo = np.searchsorted(start, a[:, axis] - longest, side="right")
    hi = np.searchsorted(start, a[:, axis + 2], side="left")
    return order, lo, np.maximum(hi - lo, 0)


def greedy_pairs(
    rows: IntArray,
    cols: IntArray,
    iou: F64Array,
    shape: tuple[int, int],
    stages: list[BoolArray],
) -> tuple[IntArray, IntArray]:
    """Greedy best-IoU-first matching of rows (detections) to columns (tracks), in stages.

    ``rows``, ``cols``, ``iou``: the candidate pairs (:func:`overlapping_pairs`, row-major)
    of a ``shape`` matrix. Stage ``k`` matches the rows in ``stages[k]`` to the columns no
    earlier stage took. Within a stage the pairs are taken best first (ties: lower row,
    then lower column), each row and column at most once. Returns the matched rows and
    their columns, in the order they were matched."""
    if not len(rows):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    # Sorted once; the pass below is one step per candidate pair (few per box).
    order = np.argsort(-iou, kind="stable")
    ii, jj = rows[order], cols[order]
    taken_row = np.zeros(shape[0], dtype=bool)
    taken_col = np.zeros(shape[1], dtype=bool)
    out_rows: list[int] = []
    out_cols: list[int] = []
    for stage in stages:
        sel = stage[ii]
        for i, j in zip(ii[sel].tolist(), jj[sel].tolist(), strict=True):
            if not taken_row[i] and not taken_col[j]:
                taken_row[i] = taken_col[j] = True
                out_rows.append(i)
                out_cols.append(j)
    return np.asarray(out_rows, dtype=np.int64), np.asarray(out_cols, dtype=np.int64)


class Tracker:
    """ByteTrack-style two-stage IoU association with a constant-velocity motion estimate.

    The tracks live in parallel arrays, one row per track, oldest first."""

    def __init__(self, settings: TrackerSettings | None = None) -> None:
        self.settings = settings or TrackerSettings()
        self._ids: IntArray = np.zeros(0, dtype=np.int64)
        self._box: F64Array = np.zeros((0, 4))  # when last seen, frame pixels
        self._seen: F64Array = np.zeros(0)  # seconds
        self._vel: F64Array = np.zeros((0, 4))  # pixels per second, per edge
        self._hits: IntArray = np.zeros(0, dtype=np.int64)
        self._misses: IntArray = np.zeros(0, dtype=np.int64)  # updates since last seen
        self._next_id = 1
        self._last_t: float | None = None

    @property
    def track_ids(self) -> list[int]:
        """The ids of the tracks alive now (seen, or kept through a short miss)."""
        ids: list[int] = self._ids.tolist()
        return ids

    def update(self, detections: npt.NDArray[np.floating], now: float) -> IntArray:
        """Track ids for ``detections`` (``(N, >=5)``: box then score) seen at ``now`` (s).

        A frame older than the last one seen (``now`` earlier) is taken as seen at the
        last time: time never runs backwards for the motion estimate."""
        cfg = self.settings
        if self._last_t is not None and now < self._last_t:
            now = self._last_t
        self._last_t = now
        keep = (self._misses < cfg.keep_frames) | (now - self._seen <= cfg.keep_s)
        if not keep.all():
            self._select(keep)
        self._misses += 1  # set back to 0 below for the tracks this frame matches
        dets = np.asarray(detections, dtype=np.float64)
        if dets.size == 0:
            return np.zeros(0, dtype=np.int64)
        dets = dets.reshape(len(dets), -1)
        boxes = dets[:, :4]
        high = dets[:, 4] >= cfg.high_score
        coast = np.minimum(now - self._seen, cfg.max_coast_s)
        predicted = self._box + self._vel * coast[:, None]
        ii, jj, iou = overlapping_pairs(boxes, predicted, cfg.match_iou)
        shape = (len(dets), len(predicted))
        rows, cols = greedy_pairs(ii, jj, iou, shape, [high, ~high])
        ids = np.zeros(len(dets), dtype=np.int64)
        if len(rows):
            ids[rows] = self._ids[cols]
            self._refresh(cols, boxes[rows], now)
        new = np.ones(len(dets), dtype=bool)
        new[rows] = False
        n_new = int(new.sum())
        if n_new:
            fresh = np.arange(self._next_id, self._next_id + n_new, dtype=np.int64)
            self._next_id += n_new
            ids[new] = fresh
            self._ids = np.concatenate([self._ids, fresh])
            self._box = np.concatenate([self._box, boxes[new]])
            self._seen = np.concatenate([self._seen, np.full(n_new, now)])
            self._vel = np.concatenate([self._vel, np.zeros((n_new, 4))])
            self._hits = np.concatenate([self._hits, np.ones(n_new, dtype=np.int64)])
            self._misses = np.concatenate([self._misses, np.zeros(n_new, dtype=np.int64)])
        return ids

    def _select(self, keep: BoolArray) -> None:
        self._ids = self._ids[keep]
        self._box = self._box[keep]
        self._seen = self._seen[keep]
        self._vel = self._vel[keep]
        self._hits = self._hits[keep]
        self._misses = self._misses[keep]

    def _refresh(self, cols: IntArray, boxes: F64Array, now: float) -> None:
        """Tracks ``cols`` were seen at ``boxes`` at ``now``: velocity, box, time, counts."""
        dt = now - self._seen[cols]
        moved = dt > 0
        if moved.any():
            c = cols[moved]
            measured = (boxes[moved] - self._box[c]) / dt[moved][:, None]
            # A track's first displacement is its velocity; later ones are smoothed in.
            gain = np.where(self._hits[c] > 1, self.settings.velocity_gain, 1.0)[:, None]
            self._vel[c] = (1 - gain) * self._vel[c] + gain * measured
        self._box[cols] = boxes
        self._seen[cols] = now
        self._hits[cols] += 1
        self._misses[cols] = 0
