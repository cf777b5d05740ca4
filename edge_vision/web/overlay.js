// Boxes on the overlay canvas, aligned with the media element whatever its size, aspect
// ratio, object-fit and device pixel ratio; each result mapped from the pixels of the frame
// it belongs to, and over the live picture each tracked box carried to where its track is
// on the frame now on screen (predict.js). Old boxes fade out when results stop coming.

import { frameToCanvas } from "./geometry.js";
import { MotionModel } from "./predict.js";
import { pictureRect } from "./source.js";
import { drawDraft, drawRegions } from "./zones.js";

const LABEL_FONT_PX = 12;

/** A distinct, saturated colour per class: hues spaced by the golden angle. */
export function classColour(cls) {
  const hue = (40 + cls * 137.508) % 360;
  const [r, g, b] = hslToRgb(hue / 360, 0.95, 0.55);
  return { css: `rgb(${r}, ${g}, ${b})`, ink: luminance(r, g, b) > 0.45 ? "#0b0b0b" : "#ffffff" };
}

function hslToRgb(h, s, l) {
  const q = l < 0.5 ? l * (1 + s) : l + s - l * s;
  const p = 2 * l - q;
  const channel = (t) => {
    const u = (t + 1) % 1;
    if (u < 1 / 6) return p + (q - p) * 6 * u;
    if (u < 1 / 2) return q;
    if (u < 2 / 3) return p + (q - p) * (2 / 3 - u) * 6;
    return p;
  };
  return [channel(h + 1 / 3), channel(h), channel(h - 1 / 3)].map((v) => Math.round(v * 255));
}

// Relative luminance, WCAG 2.x definition.
function luminance(r, g, b) {
  const lin = (c) => {
    const v = c / 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

/**
 * Draw detections with a dark halo under a coloured line and a filled label, so both read
 * on any background. The outline has the class's colour; a detection with a `track` id
 * (protocol 2) gets a label in its track's colour naming the track (`#7 93%`), so one
 * object keeps its tag and tag colour from frame to frame.
 * Labels never overlap one another: each goes above its box, else inside its top edge,
 * else below it, else down past the labels already placed.
 * @param {CanvasRenderingContext2D} ctx
 * @param {Array<{box: number[], score: number, class: number, label: string, track?: number}>} detections
 * @param {{box: (b: number[]) => number[]}} map frame pixels → canvas pixels
 * @param {number} unit canvas pixels per CSS pixel (line widths and font scale with it)
 * @returns {Array<{x: number, y: number, w: number, h: number, text: string}>} where the
 *   labels went and what they say
 */
export function drawDetections(ctx, detections, map, unit) {
  const font = `600 ${Math.round(LABEL_FONT_PX * unit)}px system-ui, -apple-system, sans-serif`;
  ctx.font = font;
  ctx.textBaseline = "middle";
  ctx.lineJoin = "round";
  const labelH = Math.round((LABEL_FONT_PX + 6) * unit);
  const pad = Math.round(4 * unit);
  const placed = [];
  for (const det of detections) {
    const [x1, y1, x2, y2] = map.box(det.box);
    const w = x2 - x1;
    const h = y2 - y1;
    const colour = classColour(det.class);
    ctx.lineWidth = 4 * unit;
    ctx.strokeStyle = "rgba(0, 0, 0, 0.7)";
    ctx.strokeRect(x1, y1, w, h);
    ctx.lineWidth = 2 * unit;
    ctx.strokeStyle = colour.css;
    ctx.strokeRect(x1, y1, w, h);

    const tagName = det.track === undefined ? `${det.label ?? det.class}` : `#${det.track}`;
    // Since protocol 2, with reading on: the text read in the box rides on its label.
    const name = typeof det.text === "string" && det.text ? `${tagName} ${det.text}` : tagName;
    // Since protocol 3: the zones the detection's anchor lies in, after its score.
    const zones = Array.isArray(det.zones) && det.zones.length ? ` · ${det.zones.join(", ")}` : "";
    const text = `${name} ${Math.round(det.score * 100)}%${zones}`;
    const textW = ctx.measureText(text).width + 2 * pad;
    const lx = Math.min(Math.max(0, x1 - unit), Math.max(0, ctx.canvas.width - textW));
    const rect = placeLabel(lx, textW, labelH, [y1 - labelH, y1, y2], placed, ctx.canvas.height);
    placed.push({ ...rect, text });
    const tag = det.track === undefined ? colour : classColour(det.track);
    ctx.fillStyle = tag.css;
    ctx.fillRect(rect.x, rect.y, rect.w, rect.h);
    ctx.fillStyle = tag.ink;
    ctx.fillText(text, rect.x + pad, rect.y + labelH / 2);
  }
  return placed;
}

const overlaps = (a, b) =>
  a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;

/**
 * The first of the candidate tops (inside the canvas) where a `w × h` label at `x` meets
 * no label already placed; failing all, the first top below the candidates that is free.
 */
export function placeLabel(x, w, h, tops, placed, height) {
  const free = (y) => !placed.some((p) => overlaps({ x, y, w, h }, p));
  for (const y of tops) {
    if (y >= 0 && y + h <= height && free(y)) return { x, y, w, h };
  }
  let y = Math.max(0, tops[0]);
  for (let guard = 0; guard <= placed.length && !free(y); guard++) {
    // just below the lowest label this one collides with
    y = Math.max(...placed.filter((p) => overlaps({ x, y, w, h }, p)).map((p) => p.y + p.h));
  }
  return { x, y, w, h };
}

export class Overlay {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {() => (HTMLVideoElement | HTMLImageElement | null)} media the element shown
   */
  constructor(canvas, media) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.media = media;
    this.view = "live"; // "live": boxes over the live picture; "analysed": the frame they belong to
    this.frozen = false; // paused: nothing fades while the picture stands still
    this.staleAfterMs = 700;
    this.fadeMs = 800;
    this.current = null; // {result, frame, receivedAt, from: track → box, glideFrom}
    this.visibleBoxes = 0;
    this.mapping = null; // the last frame→canvas map, for tests and snapshots of the view
    this.labels = []; // the label rectangles last drawn (canvas pixels) and their text
    this.glideMs = 100; // a tracked box moves to its new place over this time, not at once
    // Latency compensation (on by default; the page's "Compensate latency" box): over the
    // live picture a tracked box is drawn where its track is predicted to be now.
    this.compensate = true;
    this.motion = new MotionModel();
    this.frozenAt = null; // performance.now() when the picture froze (paused), else null
    this.drawn = []; // the boxes last drawn (canvas pixels) and their tracks, for tests
    this.drawnAt = null; // the picture time they were drawn for (ms since the epoch)
    // Zones and lines (protocol 3, zones.js), drawn under the boxes whether or not results
    // come, and the zone being drawn ({points, cursor} in fractions of the frame) or null.
    this.regions = [];
    this.draft = null;
    this.drawnRegions = []; // what was drawn of them (canvas pixels), for tests
  }

  /** The time of the picture on screen at `now` (performance.now()), on the frames' `ts`
   *  clock (the page stamps frames with performance.timeOrigin + capture time). */
  pictureTime(now) {
    const shown = this.frozen && this.frozenAt !== null ? this.frozenAt : now;
    return performance.timeOrigin + shown;
  }

  /** A result arrived for `frame` (the SentFrame it answers). */
  show(result, frame, receivedAt) {
    // Where each track's box is drawn now: its new box is reached from there. Only over
    // the live picture; the analysed frame shows the boxes exactly where that frame had them.
    const from = new Map();
    const prev = this.current;
    const sameFrameSize =
      prev && prev.result.width === result.width && prev.result.height === result.height;
    if (this.view === "live" && sameFrameSize) {
      for (const d of this.drawnDetections(receivedAt)) {
        if (d.track !== undefined) from.set(d.track, d.box);
      }
    }
    if (prev && prev.frame !== frame) prev.frame.picture.close();
    this.motion.observe(result.ts, result.detections, result.width, result.height);
    this.current = { result, frame, receivedAt, from, glideFrom: receivedAt };
  }

  /** Whether boxes are carried to the picture on screen now (live view, compensation on). */
  get predicting() {
    return this.compensate && this.view === "live";
  }

  /**
   * The current detections as drawn at `now`: over the live picture, with compensation on,
   * each tracked box where its track is predicted to be on the picture shown at `now`; a
   * tracked box glides from where it was drawn when this result came to that place over
   * `glideMs` (linear; over the live picture only).
   */
  drawnDetections(now) {
    const { result, from, glideFrom } = this.current;
    let target = result.detections;
    if (this.predicting) {
      const at = this.pictureTime(now);
      target = target.map((d) => {
        const box = this.motion.predict(d.track, d.box, result.ts, at);
        return box === d.box ? d : { ...d, box };
      });
    }
    const k = (now - glideFrom) / this.glideMs;
    if (from.size === 0 || k >= 1 || this.view !== "live") return target;
    const t = Math.max(0, k);
    return target.map((d) => {
      const a = d.track === undefined ? undefined : from.get(d.track);
      return a ? { ...d, box: d.box.map((v, i) => a[i] + (v - a[i]) * t) } : d;
    });
  }

  /** Opacity of the current boxes: 1 while fresh, fading to 0 after `staleAfterMs`. */
  alpha(now) {
    if (!this.current) return 0;
    if (this.frozen) return 1;
    const age = now - this.current.receivedAt;
    if (age <= this.staleAfterMs) return 1;
    return Math.max(0, 1 - (age - this.staleAfterMs) / this.fadeMs);
  }

  /** Redraw; returns how many ms until the drawing changes by itself (see _changesIn). */
  render(now) {
    const canvas = this.canvas;
    const cssRect = canvas.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const wantW = Math.max(1, Math.round(cssRect.width * dpr));
    const wantH = Math.max(1, Math.round(cssRect.height * dpr));
    if (canvas.width !== wantW || canvas.height !== wantH) {
      canvas.width = wantW;
      canvas.height = wantH;
    } else {
      this.ctx.clearRect(0, 0, canvas.width, canvas.height);
    }
    this.visibleBoxes = 0;
    this.mapping = null;
    this.labels = [];
    this.drawn = [];
    this.drawnAt = null;
    this.drawnRegions = [];
    const media = this.media();
    if (!media || cssRect.width === 0) return Infinity;
    const rect = pictureRect(media);
    if (!rect) return Infinity;
    const mediaBox = media.getBoundingClientRect();
    // canvas pixels per CSS pixel, exact even when the backing size was rounded
    const unit = canvas.width / cssRect.width;
    const offX = mediaBox.left - cssRect.left + media.clientLeft;
    const offY = mediaBox.top - cssRect.top + media.clientTop;
    const ctx = this.ctx;
    const fractions = frameToCanvas(rect, 1, 1, unit, offX, offY);
    const toCanvas = (p) => fractions.box([p[0], p[1], p[0], p[1]]).slice(0, 2);
    if (!this.current) {
      this._drawRegions(toCanvas, unit);
      return Infinity;
    }
    const { result, frame } = this.current;
    const map = frameToCanvas(rect, result.width, result.height, unit, offX, offY);
    this.mapping = { rect, unit, offX, offY, frameW: result.width, frameH: result.height };
    const alpha = this.alpha(now);
    if (this.view === "analysed") {
      const tl = map.box([0, 0, result.width, result.height]);
      ctx.drawImage(frame.picture, tl[0], tl[1], tl[2] - tl[0], tl[3] - tl[1]);
    }
    this._drawRegions(toCanvas, unit);
    if (alpha > 0 && result.detections.length) {
      ctx.save();
      ctx.globalAlpha = alpha;
      const shown = this.drawnDetections(now);
      this.labels = drawDetections(ctx, shown, map, unit);
      ctx.restore();
      this.drawn = shown.map((d) => ({ track: d.track ?? null, box: map.box(d.box) }));
      this.drawnAt = this.pictureTime(now);
      this.visibleBoxes = result.detections.length;
    }
    return this._changesIn(now);
  }

  _drawRegions(toCanvas, unit) {
    if (this.regions.length) this.drawnRegions = drawRegions(this.ctx, this.regions, toCanvas, unit);
    if (this.draft) drawDraft(this.ctx, this.draft, toCanvas, unit);
  }

  // How long until the drawing changes by itself (a fade starts or goes on): 0 means on the
  // next animation frame, Infinity never.
  _changesIn(now) {
    if (!this.current || this.frozen || !this.current.result.detections.length) return Infinity;
    const { from, glideFrom, result } = this.current;
    if (from.size && this.view === "live" && now - glideFrom < this.glideMs) return 0;
    const at = this.pictureTime(now);
    if (this.predicting && this.motion.moving(result.detections, result.ts, at)) {
      return 0; // moving boxes follow the picture frame by frame
    }
    const age = now - this.current.receivedAt;
    if (age < this.staleAfterMs) return this.staleAfterMs - age;
    return age < this.staleAfterMs + this.fadeMs ? 0 : Infinity;
  }

  /**
   * The frame the current boxes belong to, at its full captured size, with those boxes,
   * as a PNG; the live picture when no result has come back yet.
   * @returns {Promise<Blob | null>}
   */
  async snapshot() {
    const out = document.createElement("canvas");
    const ctx = out.getContext("2d");
    if (this.current) {
      const { result, frame } = this.current;
      out.width = frame.picture.width;
      out.height = frame.picture.height;
      ctx.drawImage(frame.picture, 0, 0);
      const whole = { x: 0, y: 0, width: out.width, height: out.height };
      const map = frameToCanvas(whole, result.width, result.height);
      const unit = Math.max(1, out.width / 640);
      const toCanvas = (p) => [p[0] * out.width, p[1] * out.height];
      if (this.regions.length) drawRegions(ctx, this.regions, toCanvas, unit);
      drawDetections(ctx, result.detections, map, unit);
    } else {
      const media = this.media();
      if (!media) return null;
      const picture = await createImageBitmap(media);
      out.width = picture.width;
      out.height = picture.height;
      ctx.drawImage(picture, 0, 0);
      picture.close();
    }
    return new Promise((resolve) => out.toBlob(resolve, "image/png"));
  }
}
