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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .agreement import pairwise_iou

F32Array = npt.NDArray[np.float32]
F64Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class Track:
    id: int
    box: F64Array  # x1, y1, x2, y2 when last seen, frame pixels
    seen_at: float  # seconds
    velocity: F64Array = field(default_factory=lambda: np.zeros(4))  # pixels per second
    hits: int = 1
    misses: int = 0  # updates since it was last seen

    def predict(self, now: float) -> F64Array:
        box: F64Array = self.box + self.velocity * (now - self.seen_at)
        return box


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


class Tracker:
    """ByteTrack-style two-stage IoU association with a constant-velocity motion estimate."""

    def __init__(self, settings: TrackerSettings | None = None) -> None:
        self.settings = settings or TrackerSettings()
        self.tracks: list[Track] = []
        self._next_id = 1
        self._last_t: float | None = None

    def update(self, detections: npt.NDArray[np.floating], now: float) -> IntArray:
        """Track ids for ``detections`` (``(N, >=5)``: box then score) seen at ``now`` (s).

        A frame older than the last one seen (``now`` earlier) is taken as seen at the
        last time: time never runs backwards for the motion estimate."""
        cfg = self.settings
        if self._last_t is not None and now < self._last_t:
            now = self._last_t
        self._last_t = now
        self.tracks = [
            t for t in self.tracks if t.misses < cfg.keep_frames or now - t.seen_at <= cfg.keep_s
        ]
        dets = np.asarray(detections, dtype=np.float64)
        for t in self.tracks:  # set back to 0 below for the tracks this frame matches
            t.misses += 1
        if dets.size == 0:
            return np.zeros(0, dtype=np.int64)
        ids = np.zeros(len(dets), dtype=np.int64)
        boxes = dets[:, :4]
        scores = dets[:, 4]
        predicted = np.array(
            [t.predict(min(now, t.seen_at + cfg.max_coast_s)) for t in self.tracks]
        ).reshape(-1, 4)
        iou = pairwise_iou(boxes, predicted).astype(np.float64)
        free_tracks = np.ones(len(self.tracks), dtype=bool)
        assigned = np.full(len(dets), -1, dtype=np.int64)
        high = scores >= cfg.high_score
        for stage in (high, ~high):
            self._associate(iou, stage, free_tracks, assigned)
        for i in range(len(dets)):
            j = int(assigned[i])
            if j >= 0:
                track = self.tracks[j]
                self._refresh(track, boxes[i], now)
            else:
                track = Track(self._next_id, boxes[i].copy(), now)
                self._next_id += 1
                self.tracks.append(track)
            ids[i] = track.id
        return ids

    def _associate(
        self,
        iou: F64Array,
        rows: npt.NDArray[np.bool_],
        free_tracks: npt.NDArray[np.bool_],
        assigned: IntArray,
    ) -> None:
        """Greedy matching, best IoU first, of the detections in ``rows`` to free tracks."""
        if not iou.size:
            return
        cand = np.where(rows[:, None] & free_tracks[None, :], iou, 0.0)
        # Only pairs over the threshold can match, and a box overlaps few tracks: sorting
        # those pairs once keeps this O(k log k), not a scan of the matrix per match.
        ii, jj = np.nonzero(cand >= max(self.settings.match_iou, 1e-9))
        taken_det = assigned >= 0
        for k in np.argsort(-cand[ii, jj], kind="stable"):
            i, j = int(ii[k]), int(jj[k])
            if not taken_det[i] and free_tracks[j]:
                assigned[i] = j
                taken_det[i] = True
                free_tracks[j] = False

    def _refresh(self, track: Track, box: F64Array, now: float) -> None:
        dt = now - track.seen_at
        if dt > 0:
            measured = (box - track.box) / dt
            gain = self.settings.velocity_gain if track.hits > 1 else 1.0
            track.velocity = (1 - gain) * track.velocity + gain * measured
        track.box = box.copy()
        track.seen_at = now
        track.hits += 1
        track.misses = 0
