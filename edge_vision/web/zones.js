// Zones and lines (protocol 3, docs/events.md) over the picture: the node's (hello's
// `events`) and the session's own (its settings), drawn on the overlay canvas; and the
// drawing of a new zone, point by point, with the mouse or the keyboard. Coordinates are
// fractions of the frame (0..1, x right, y down), as the server takes them.

import { pictureRect } from "./source.js";

/** What a zone's, line's and rule's name may be (docs/protocol.md, `Name`). */
export const NAME_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;

/** Points a zone may have (docs/events.md): 3 to 64. */
export const MIN_POINTS = 3;
export const MAX_POINTS = 64;

const NAME_FONT_PX = 12;
const ARROW_PX = 22;

/**
 * One zone or line to draw.
 * @typedef {{name: string, kind: "zone" | "line", source: "node" | "session",
 *            points: number[][]}} Region
 */

/**
 * The regions of a node (hello's `events`, absent on a node before this field) and of a
 * session (its settings' `zones` and `lines`), node's first.
 * @param {?{zones?: Object<string, number[][]>, lines?: Object<string, number[][]>}} node
 * @param {?{zones?: Object<string, number[][]>, lines?: Object<string, number[][]>}} session
 * @returns {Region[]}
 */
export function regionsOf(node, session) {
  const out = [];
  for (const [source, from] of [["node", node], ["session", session]]) {
    for (const [name, points] of Object.entries((from && from.zones) || {})) {
      out.push({ name, kind: "zone", source, points });
    }
    for (const [name, points] of Object.entries((from && from.lines) || {})) {
      out.push({ name, kind: "line", source, points });
    }
  }
  return out;
}

/** A colour per name (the same zone keeps its colour): a hue from the name's hash. */
export function regionColour(name) {
  let h = 2166136261;
  for (const ch of name) h = Math.imul(h ^ ch.codePointAt(0), 16777619);
  const hue = (h >>> 0) % 360;
  return {
    stroke: `hsl(${hue} 90% 60%)`,
    fill: `hsl(${hue} 90% 55% / 0.2)`,
    label: `hsl(${hue} 90% 60% / 0.9)`,
  };
}

/**
 * Draw zones (filled translucent polygons, named at their top-left corner) and lines (their
 * name, and an arrow from their middle towards their forward side: crossing from the left
 * to the right of the line walking from its first point to its second, docs/events.md).
 * @param {CanvasRenderingContext2D} ctx
 * @param {Region[]} regions
 * @param {(p: number[]) => number[]} toCanvas fraction of the frame → canvas pixels
 * @param {number} unit canvas pixels per CSS pixel
 * @returns {Array<{name: string, kind: string, source: string, points: number[][]}>} what
 *   was drawn, in canvas pixels
 */
export function drawRegions(ctx, regions, toCanvas, unit) {
  const drawn = [];
  ctx.save();
  ctx.font = `600 ${Math.round(NAME_FONT_PX * unit)}px system-ui, -apple-system, sans-serif`;
  ctx.textBaseline = "top";
  ctx.lineJoin = "round";
  for (const region of regions) {
    const pts = region.points.map(toCanvas);
    const colour = regionColour(region.name);
    ctx.beginPath();
    pts.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    if (region.kind === "zone") {
      ctx.closePath();
      ctx.fillStyle = colour.fill;
      ctx.fill();
    }
    ctx.setLineDash(region.source === "session" ? [8 * unit, 4 * unit] : []);
    ctx.lineWidth = 2 * unit;
    ctx.strokeStyle = colour.stroke;
    ctx.stroke();
    ctx.setLineDash([]);
    let at;
    if (region.kind === "line") {
      at = drawArrow(ctx, pts[0], pts[1], unit, colour.stroke);
    } else {
      // The middle of its top edge (the heads-up display covers the picture's top-left).
      const xs = pts.map((p) => p[0]);
      at = [(Math.min(...xs) + Math.max(...xs)) / 2, Math.min(...pts.map((p) => p[1]))];
    }
    const pad = 3 * unit;
    const w = ctx.measureText(region.name).width + 2 * pad;
    const h = (NAME_FONT_PX + 4) * unit;
    const x = Math.min(Math.max(0, at[0] + pad), ctx.canvas.width - w);
    const y = Math.min(Math.max(0, at[1] + pad), ctx.canvas.height - h);
    ctx.fillStyle = "rgba(0, 0, 0, 0.6)";
    ctx.fillRect(x, y, w, h);
    ctx.fillStyle = colour.label;
    ctx.fillText(region.name, x + pad, y + 2 * unit);
    drawn.push({ name: region.name, kind: region.kind, source: region.source, points: pts });
  }
  ctx.restore();
  return drawn;
}

/** The forward arrow of a line from `a` to `b`; returns where its name goes. */
function drawArrow(ctx, a, b, unit, colour) {
  const dx = b[0] - a[0];
  const dy = b[1] - a[1];
  const len = Math.hypot(dx, dy) || 1;
  // Forward: to the right walking from a to b, on a picture whose y grows downwards.
  const nx = -dy / len;
  const ny = dx / len;
  const mx = (a[0] + b[0]) / 2;
  const my = (a[1] + b[1]) / 2;
  const tip = [mx + nx * ARROW_PX * unit, my + ny * ARROW_PX * unit];
  const head = 7 * unit;
  ctx.beginPath();
  ctx.moveTo(mx, my);
  ctx.lineTo(tip[0], tip[1]);
  ctx.moveTo(tip[0] - nx * head + ny * head * 0.6, tip[1] - ny * head - nx * head * 0.6);
  ctx.lineTo(tip[0], tip[1]);
  ctx.lineTo(tip[0] - nx * head - ny * head * 0.6, tip[1] - ny * head + nx * head * 0.6);
  ctx.lineWidth = 2 * unit;
  ctx.strokeStyle = colour;
  ctx.stroke();
  return [mx - nx * (ARROW_PX * unit), my - ny * (ARROW_PX * unit)];
}

/**
 * A zone being drawn: its points so far, joined, and a dashed segment to the cursor.
 * @param {CanvasRenderingContext2D} ctx
 * @param {{points: number[][], cursor: ?number[]}} draft fractions of the frame
 * @param {(p: number[]) => number[]} toCanvas
 * @param {number} unit
 */
export function drawDraft(ctx, draft, toCanvas, unit) {
  const pts = draft.points.map(toCanvas);
  const cursor = draft.cursor ? toCanvas(draft.cursor) : null;
  ctx.save();
  ctx.lineWidth = 2 * unit;
  ctx.strokeStyle = "#f5b81c";
  ctx.fillStyle = "rgba(245, 184, 28, 0.15)";
  if (pts.length) {
    ctx.beginPath();
    pts.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    if (cursor) ctx.lineTo(cursor[0], cursor[1]);
    if (pts.length + (cursor ? 1 : 0) >= MIN_POINTS) ctx.fill();
    ctx.stroke();
  }
  ctx.fillStyle = "#f5b81c";
  for (const [x, y] of pts) ctx.fillRect(x - 3 * unit, y - 3 * unit, 6 * unit, 6 * unit);
  if (cursor) {
    // A crosshair where the next point goes (moved by the mouse or the arrow keys).
    const r = 8 * unit;
    ctx.beginPath();
    ctx.moveTo(cursor[0] - r, cursor[1]);
    ctx.lineTo(cursor[0] + r, cursor[1]);
    ctx.moveTo(cursor[0], cursor[1] - r);
    ctx.lineTo(cursor[0], cursor[1] + r);
    ctx.stroke();
  }
  ctx.restore();
}

/**
 * The point of the picture under a pointer at (`clientX`, `clientY`), as fractions of the
 * frame (clamped to the picture), for the element showing it whatever its fit; `null`
 * while nothing is shown.
 * @param {HTMLVideoElement | HTMLImageElement | null} media
 * @param {number} clientX
 * @param {number} clientY
 * @returns {?number[]}
 */
export function pictureFraction(media, clientX, clientY) {
  if (!media) return null;
  const rect = pictureRect(media);
  if (!rect) return null;
  const box = media.getBoundingClientRect();
  const fx = (clientX - box.left - media.clientLeft - rect.x) / rect.width;
  const fy = (clientY - box.top - media.clientTop - rect.y) / rect.height;
  return [roundFraction(fx), roundFraction(fy)];
}

/** Clamped to 0..1 and rounded to 4 decimals (a tenth of a pixel of a 1000 px frame). */
export function roundFraction(v) {
  return Math.round(Math.min(1, Math.max(0, v)) * 10000) / 10000;
}

/**
 * Drawing one zone: points added by clicks or the keyboard, a cursor the arrow keys move.
 * `onChange` is called after every change (to redraw and say how far it got).
 */
export class ZoneDraft {
  /** @param {() => void} onChange */
  constructor(onChange) {
    this.onChange = onChange;
    /** @type {number[][]} */
    this.points = [];
    /** @type {?number[]} */
    this.cursor = [0.5, 0.5];
  }

  /** Add a point; one on (or within half a percent of) the last is the same point. */
  add(p) {
    const last = this.points[this.points.length - 1];
    if (last && Math.abs(last[0] - p[0]) < 0.005 && Math.abs(last[1] - p[1]) < 0.005) return;
    if (this.points.length >= MAX_POINTS) return;
    this.points.push(p);
    this.cursor = p;
    this.onChange();
  }

  undo() {
    this.points.pop();
    this.onChange();
  }

  moveCursor(p) {
    this.cursor = p;
    this.onChange();
  }

  /** Move the cursor by (dx, dy), fractions of the frame. */
  nudge(dx, dy) {
    const [x, y] = this.cursor ?? [0.5, 0.5];
    this.moveCursor([roundFraction(x + dx), roundFraction(y + dy)]);
  }

  get closable() {
    return this.points.length >= MIN_POINTS;
  }
}
