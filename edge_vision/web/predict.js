// Latency compensation: a result describes the frame the page sent a round trip ago, while
// the picture on screen is the camera's newest. Each track's motion is estimated from its
// recent boxes (timestamped with their frames' own `ts`), and its box is drawn where the
// track is predicted to be at the time of the picture on screen. Pure: no DOM, no clock;
// the browser tests call it with literal histories.

/** Boxes of a track older than this (before its newest) do not count for its motion. */
export const HISTORY_MS = 1500;
/** At most this many recent boxes a track. */
export const MAX_POINTS = 8;
/** A box is carried at most this far past its frame: beyond it, a guess is no better. */
export const MAX_AHEAD_MS = 1000;
/** A track whose boxes moved less than this (frame pixels) over their span stands still: a
 *  label that does not move keeps its box, whatever the detector's jitter between frames. */
export const MIN_TRAVEL_PX = 3;

/**
 * The slope of `values` against `times` by least squares (a line through the points):
 * noise in any one box moves it little; null for fewer than two distinct times.
 * @param {number[]} times
 * @param {number[]} values
 * @returns {number|null}
 */
export function slope(times, values) {
  const n = times.length;
  if (n < 2) return null;
  const mt = times.reduce((a, b) => a + b, 0) / n;
  const mv = values.reduce((a, b) => a + b, 0) / n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    num += (times[i] - mt) * (values[i] - mv);
    den += (times[i] - mt) ** 2;
  }
  return den > 0 ? num / den : null;
}

/** Each track's recent boxes, and where they put the track at a later time. */
export class MotionModel {
  constructor({ historyMs = HISTORY_MS, maxPoints = MAX_POINTS, maxAheadMs = MAX_AHEAD_MS } = {}) {
    this.historyMs = historyMs;
    this.maxPoints = maxPoints;
    this.maxAheadMs = maxAheadMs;
    /** @type {Map<number, Array<{t: number, box: number[]}>>} track → boxes, oldest first */
    this.tracks = new Map();
    this.frameSize = "";
  }

  /**
   * A result's boxes: `ts` is its frame's own time (ms; the page's capture time), `width`
   * and `height` the frame's size (a new size is new pixels: what was known is forgotten).
   * Untracked boxes and results without a time add nothing.
   * @param {number|null} ts
   * @param {Array<{box: number[], track?: number}>} detections
   * @param {number} width
   * @param {number} height
   */
  observe(ts, detections, width, height) {
    const size = `${width}x${height}`;
    if (size !== this.frameSize) {
      this.tracks.clear();
      this.frameSize = size;
    }
    if (typeof ts !== "number" || !Number.isFinite(ts)) return;
    for (const d of detections) {
      if (d.track === undefined || d.track === null) continue;
      let boxes = this.tracks.get(d.track);
      if (!boxes) {
        boxes = [];
        this.tracks.set(d.track, boxes);
      }
      const last = boxes[boxes.length - 1];
      if (last && ts <= last.t) continue; // an older frame's answer adds nothing new
      boxes.push({ t: ts, box: d.box.slice(0, 4) });
      while (boxes.length > this.maxPoints || ts - boxes[0].t > this.historyMs) boxes.shift();
    }
    // Tracks not seen for a while are gone (the tracker gives a returning label its id back
    // within about a second; after that, its old motion means nothing).
    for (const [track, boxes] of this.tracks) {
      if (ts - boxes[boxes.length - 1].t > 2 * this.historyMs) this.tracks.delete(track);
    }
  }

  /**
   * A track's velocity, frame pixels a millisecond for each of x1, y1, x2, y2; null while
   * it has fewer than two boxes; zeros while it stands still (its centre travels less than
   * MIN_TRAVEL_PX over the time its boxes span).
   * @param {number} track
   * @returns {number[]|null}
   */
  velocity(track) {
    const boxes = this.tracks.get(track);
    if (!boxes || boxes.length < 2) return null;
    const times = boxes.map((b) => b.t);
    const v = [0, 1, 2, 3].map((i) => slope(times, boxes.map((b) => b.box[i])));
    if (v.some((s) => s === null)) return null;
    const speed = Math.hypot(
      ((v[0] ?? 0) + (v[2] ?? 0)) / 2,
      ((v[1] ?? 0) + (v[3] ?? 0)) / 2,
    );
    const span = times[times.length - 1] - times[0];
    return speed * span < MIN_TRAVEL_PX ? [0, 0, 0, 0] : v.map((s) => s ?? 0);
  }

  /**
   * Where the box `box` of `track`, seen in the frame of time `ts`, is at time `at`: moved
   * by the track's velocity for `at - ts` (at most maxAheadMs; never back in time), kept
   * inside the frame. Unchanged for an unknown track, an untracked box or no `ts`.
   * @param {number|undefined} track
   * @param {number[]} box
   * @param {number|null} ts
   * @param {number} at
   * @returns {number[]}
   */
  predict(track, box, ts, at) {
    if (track === undefined || typeof ts !== "number") return box;
    const v = this.velocity(track);
    if (!v) return box;
    const dt = Math.min(Math.max(0, at - ts), this.maxAheadMs);
    const [w, h] = this.frameSize.split("x").map(Number);
    const limit = [w, h, w, h];
    return box.map((c, i) => Math.min(Math.max(0, c + v[i] * dt), limit[i]));
  }

  /**
   * Whether a prediction of these boxes still changes with time at `at` (a tracked box
   * moving, and not yet carried maxAheadMs): the overlay redraws every frame meanwhile.
   * @param {Array<{track?: number}>} detections
   * @param {number|null} ts
   * @param {number} at
   */
  moving(detections, ts, at) {
    if (typeof ts !== "number" || at - ts >= this.maxAheadMs) return false;
    return detections.some((d) => {
      const v = d.track === undefined ? null : this.velocity(d.track);
      return v !== null && v.some((s) => s !== 0);
    });
  }
}
