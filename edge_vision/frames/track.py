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

Ids count up from 1 per session and are never reused within it: the tracker belongs to
the session (:class:`edge_vision.session.record.Session`), and its state
(:meth:`Tracker.to_state`) is written into the session record, so a session resumed on
this node or another continues its ids and keeps the tracks it had
(docs/state.md, "Session record").

Besides :meth:`Tracker.update`, which every answered frame goes through in frame order,
:meth:`Tracker.match` says which live track each detection would join without changing
anything (the read stage asks it while older frames are still on their way to the reply),
the tracks the tracker forgot are handed out by :meth:`Tracker.take_ended` (for ``leave``
events, edge_vision.events), and :meth:`Tracker.expire` forgets, on a timer, the tracks of
a stream that went quiet.

Cost: a frame of a live camera holds a few boxes, and the update runs on the event loop
for every answered frame (connection.py, in reply order, which keeps one session's updates
in frame order and never two at once), so the tracks are plain Python records and a few
boxes are paired by plain arithmetic: for a handful of boxes numpy's fixed cost a call
outweighs the arithmetic it does, on every answered frame. Many boxes (a printed page) are
paired by numpy, sweeping only the (detections × tracks) pairs that can overlap; a page's
update costs more with plain records than it would with arrays, the price of the few-box
case (``python -m benchmarks.tracker``; docs/results.md, "Track ids";
docs/benchmarks.md, "fewer numpy calls a frame, and 4× in one run").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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


def _few_pairs(
    a: list[list[float]], b: list[tuple[float, float, float, float]], threshold: float
) -> list[tuple[int, int, float]]:
    """:func:`overlapping_pairs` for a few boxes, in plain arithmetic (the same as
    :func:`_iou`'s, in the same order, so the same IoUs to the last bit): ``(row of a,
    row of b, IoU)``, row-major."""
    out = []
    floor = max(threshold, 1e-9)
    areas_b = [max(x2 - x1, 0.0) * max(y2 - y1, 0.0) for x1, y1, x2, y2 in b]
    for i, (ax1, ay1, ax2, ay2) in enumerate(a):
        area_a = max(ax2 - ax1, 0.0) * max(ay2 - ay1, 0.0)
        for j, (bx1, by1, bx2, by2) in enumerate(b):
            w = min(ax2, bx2) - max(ax1, bx1)
            h = min(ay2, by2) - max(ay1, by1)
            inter = max(w, 0.0) * max(h, 0.0)
            union = area_a + areas_b[j] - inter
            iou = inter / union if union > 0 else 0.0
            if iou >= floor:
                out.append((i, j, iou))
    return out


#: Up to this many (detection, track) pairs, :func:`_few_pairs`; more, numpy's
#: :func:`overlapping_pairs`.
_FEW_PAIRS = 64


def greedy_pairs(
    pairs: list[tuple[int, int, float]], stages: list[list[bool]]
) -> list[tuple[int, int]]:
    """Greedy best-IoU-first matching of rows (detections) to columns (tracks), in stages.

    ``pairs``: the candidate ``(row, column, IoU)`` pairs, row-major. Stage ``k`` matches
    the rows ``stages[k]`` marks to the columns no earlier stage took. Within a stage the
    pairs are taken best first (ties: lower row, then lower column), each row and column at
    most once. Returns the matched ``(row, column)`` pairs, in the order they were matched."""
    ranked = sorted(pairs, key=lambda p: -p[2])  # stable: ties keep row-major order
    taken_row = [False] * len(stages[0])
    taken_col: set[int] = set()
    out: list[tuple[int, int]] = []
    for stage in stages:
        for i, j, _ in ranked:
            if stage[i] and not taken_row[i] and j not in taken_col:
                taken_row[i] = True
                taken_col.add(j)
                out.append((i, j))
    return out


@dataclass(slots=True)
class _Track:
    id: int
    box: list[float]  # when last seen, frame pixels
    seen: float  # seconds
    vel: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # pixels a second, per edge
    hits: int = 1
    misses: int = 0  # updates since last seen


#: Version of :meth:`Tracker.to_state`'s layout; a state of another version starts afresh.
STATE_VERSION = 1
#: Weight of the newest gap between frames in the frame interval :meth:`Tracker.expire`
#: uses.
_GAP_GAIN = 0.2


class Tracker:
    """ByteTrack-style two-stage IoU association with a constant-velocity motion estimate.

    The tracks are kept oldest first."""

    def __init__(self, settings: TrackerSettings | None = None) -> None:
        self.settings = settings or TrackerSettings()
        self._tracks: list[_Track] = []
        self._next_id = 1
        self._last_t: float | None = None
        self._gap: float | None = None  # smoothed seconds between updates
        self._since = float("-inf")  # restored at: the timer counts from here (expire)
        # Forgotten tracks are noted for take_ended() only for a caller that takes them.
        self.reports_ended = False
        self._ended: list[int] = []

    @property
    def track_ids(self) -> list[int]:
        """The ids of the tracks alive now (seen, or kept through a short miss)."""
        return [t.id for t in self._tracks]

    @property
    def next_id(self) -> int:
        """The id the next new track gets."""
        return self._next_id

    def take_ended(self) -> list[int]:
        """The ids of the tracks forgotten since the last call (by :meth:`update`,
        :meth:`expire` or :meth:`end_all`), oldest first; noted only while
        :attr:`reports_ended` is set."""
        ended, self._ended = self._ended, []
        return ended

    def _live(self, now: float) -> list[_Track]:
        keep_frames, keep_s = self.settings.keep_frames, self.settings.keep_s
        return [t for t in self._tracks if t.misses < keep_frames or now - t.seen <= keep_s]

    def _pairs(
        self, dets: F64Array, tracks: list[_Track], now: float
    ) -> tuple[list[list[float]], list[tuple[int, int]]]:
        """The detections' boxes and the (detection, track) pairs the association makes."""
        cfg = self.settings
        rows = dets[:, :5].tolist()
        boxes = [r[:4] for r in rows]
        high = [r[4] >= cfg.high_score for r in rows]
        coast_s = cfg.max_coast_s
        predicted = []
        for t in tracks:
            coast = now - t.seen
            if coast > coast_s:  # min(), written out: a call a track counts at 300 boxes
                coast = coast_s
            (x1, y1, x2, y2), (v1, v2, v3, v4) = t.box, t.vel
            predicted.append((x1 + v1 * coast, y1 + v2 * coast, x2 + v3 * coast, y2 + v4 * coast))
        if len(boxes) * len(predicted) <= _FEW_PAIRS:
            pairs = _few_pairs(boxes, predicted, cfg.match_iou)
        else:
            ii, jj, iou = overlapping_pairs(dets[:, :4], np.array(predicted), cfg.match_iou)
            pairs = list(zip(ii.tolist(), jj.tolist(), iou.tolist(), strict=True))
        return boxes, greedy_pairs(pairs, [high, [not h for h in high]])

    def match(self, detections: npt.NDArray[np.floating], now: float) -> list[int]:
        """The live track each detection would join if :meth:`update` saw it at ``now``,
        0 for one that would start a new track. Changes nothing."""
        dets = np.asarray(detections, dtype=np.float64)
        if dets.size == 0:
            return []
        dets = dets.reshape(len(dets), -1)
        if self._last_t is not None and now < self._last_t:
            now = self._last_t
        tracks = self._live(now)
        ids = [0] * len(dets)
        if tracks:
            for i, j in self._pairs(dets, tracks, now)[1]:
                ids[i] = tracks[j].id
        return ids

    def update(self, detections: npt.NDArray[np.floating], now: float) -> IntArray:
        """Track ids for ``detections`` (``(N, >=5)``: box then score) seen at ``now`` (s).

        A frame older than the last one seen (``now`` earlier) is taken as seen at the
        last time: time never runs backwards for the motion estimate."""
        cfg = self.settings
        if self._last_t is not None:
            if now < self._last_t:
                now = self._last_t
            gap = now - self._last_t
            self._gap = gap if self._gap is None else self._gap + _GAP_GAIN * (gap - self._gap)
        self._last_t = now
        tracks = self._live(now)
        if self.reports_ended and len(tracks) != len(self._tracks):
            kept = {id(t) for t in tracks}
            self._ended += [t.id for t in self._tracks if id(t) not in kept]
        for t in tracks:
            t.misses += 1  # set back to 0 below for the tracks this frame matches
        self._tracks = tracks
        dets = np.asarray(detections, dtype=np.float64)
        if dets.size == 0:
            return np.zeros(0, dtype=np.int64)
        dets = dets.reshape(len(dets), -1)
        boxes, matched = self._pairs(dets, tracks, now)
        ids = [0] * len(boxes)
        gain_later = cfg.velocity_gain
        for i, j in matched:
            # Track j was seen at box i now: its velocity, box, time and counts.
            t = tracks[j]
            ids[i] = t.id
            box = boxes[i]
            dt = now - t.seen
            if dt > 0:
                # A track's first displacement is its velocity; later ones are smoothed in.
                g = gain_later if t.hits > 1 else 1.0
                h = 1 - g
                (v1, v2, v3, v4), (o1, o2, o3, o4), (b1, b2, b3, b4) = t.vel, t.box, box
                t.vel = (
                    h * v1 + g * ((b1 - o1) / dt),
                    h * v2 + g * ((b2 - o2) / dt),
                    h * v3 + g * ((b3 - o3) / dt),
                    h * v4 + g * ((b4 - o4) / dt),
                )
            t.box = box
            t.seen = now
            t.hits += 1
            t.misses = 0
        for i, got in enumerate(ids):
            if not got:  # unmatched: a new track, in detection order
                ids[i] = self._next_id
                tracks.append(_Track(self._next_id, boxes[i], now))
                self._next_id += 1
        return np.array(ids, dtype=np.int64)

    # -- quiet streams and resumed sessions ------------------------------------------

    def expire_after(self) -> float:
        """Seconds after a track was last seen that :meth:`expire` forgets it: the keep
        time, or as many frame intervals as the tracker keeps a missed track (and one
        more), whichever is longer, so a slow stream's tracks are never forgotten between
        two of its frames."""
        cfg = self.settings
        return max(cfg.keep_s, (cfg.keep_frames + 1) * (self._gap or 0.0))

    def expire(self, now: float) -> list[int]:
        """Forget the tracks not seen for :meth:`expire_after` seconds at ``now`` (the
        stream went quiet: no frame came to miss them), counted from no earlier than the
        moment the tracker was restored. Returns their ids (also for
        :meth:`take_ended`)."""
        limit = self.expire_after()
        since = self._since
        gone = [t for t in self._tracks if now - max(t.seen, since) > limit]
        if gone:
            ids = {t.id for t in gone}
            self._tracks = [t for t in self._tracks if t.id not in ids]
            if self.reports_ended:
                self._ended += [t.id for t in gone]
        return [t.id for t in gone]

    def end_all(self) -> list[int]:
        """Forget every track (the session ended); the ids go on counting."""
        ids = [t.id for t in self._tracks]
        self._tracks = []
        if self.reports_ended:
            self._ended += ids
        return ids

    def to_state(self, now: float) -> dict[str, Any]:
        """What :meth:`from_state` needs to carry on, as plain JSON values: the next id
        and the live tracks, their times as seconds before ``now`` (the caller's clock:
        the state may be restored in another process, on another machine)."""
        last = None if self._last_t is None else round(now - self._last_t, 4)
        return {
            "v": STATE_VERSION,
            "next": self._next_id,
            "last": last,
            "gap": None if self._gap is None else round(self._gap, 4),
            "tracks": [
                [
                    t.id,
                    *(round(v, 2) for v in t.box),
                    round(now - t.seen, 4),
                    *(round(v, 3) for v in t.vel),
                    t.hits,
                    t.misses,
                ]
                for t in self._tracks
            ],
        }

    @classmethod
    def from_state(
        cls,
        state: Any,
        now: float,
        stored_s: float = 0.0,
        settings: TrackerSettings | None = None,
    ) -> Tracker:
        """A tracker that carries on, at ``now`` on this process's clock, from
        :meth:`to_state`'s ``state``, written ``stored_s`` seconds ago. ``ValueError``
        for a state this version cannot read."""
        tracker = cls(settings)
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"not a tracker state of version {STATE_VERSION}")
        try:
            tracker._next_id = int(state["next"])
            last, gap = state.get("last"), state.get("gap")
            then = now - max(stored_s, 0.0)  # when the state was written, on our clock
            tracker._last_t = None if last is None else then - float(last)
            tracker._gap = None if gap is None else float(gap)
            for row in state["tracks"]:
                tid, x1, y1, x2, y2, age, v1, v2, v3, v4, hits, misses = row
                tracker._tracks.append(
                    _Track(
                        int(tid),
                        [float(x1), float(y1), float(x2), float(y2)],
                        then - float(age),
                        (float(v1), float(v2), float(v3), float(v4)),
                        int(hits),
                        int(misses),
                    )
                )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"unreadable tracker state: {e}") from None
        if tracker._tracks and tracker._next_id <= max(t.id for t in tracker._tracks):
            raise ValueError("tracker state: next id not above its tracks' ids")
        tracker._since = now
        return tracker
