// Where boxes go: from the pixels of the frame the server saw to the pixels of the overlay
// canvas. Pure functions, no DOM; tests call them through the page.

/**
 * The rectangle in which an element paints its intrinsic content, relative to the element's
 * box, as CSS Images 3 defines `object-fit` (§5.5) and `object-position` (§5.6).
 *
 * @param {number} boxW element box width (CSS px)
 * @param {number} boxH element box height (CSS px)
 * @param {number} natW intrinsic width (video.videoWidth, img.naturalWidth)
 * @param {number} natH intrinsic height
 * @param {string} fit "contain" | "cover" | "fill" | "none" | "scale-down"
 * @param {string} position computed `object-position`, e.g. "50% 50%" or "10px 0px"
 * @returns {{x: number, y: number, width: number, height: number} | null}
 */
export function contentRect(boxW, boxH, natW, natH, fit = "contain", position = "50% 50%") {
  if (!(boxW > 0 && boxH > 0 && natW > 0 && natH > 0)) return null;
  let width = natW;
  let height = natH;
  if (fit === "fill") {
    width = boxW;
    height = boxH;
  } else if (fit !== "none") {
    let scale =
      fit === "cover" ? Math.max(boxW / natW, boxH / natH) : Math.min(boxW / natW, boxH / natH);
    if (fit === "scale-down") scale = Math.min(1, scale);
    width = natW * scale;
    height = natH * scale;
  }
  const [px, py] = splitPosition(position);
  return {
    x: resolveOffset(px, boxW - width),
    y: resolveOffset(py, boxH - height),
    width,
    height,
  };
}

function splitPosition(position) {
  const parts = String(position || "").trim().split(/\s+/);
  return [parts[0] || "50%", parts[1] || parts[0] || "50%"];
}

// An `object-position` component is a percentage of the free space or a length in px;
// anything else (calc(), keywords a browser did not resolve) falls back to centring.
function resolveOffset(token, free) {
  const m = /^(-?[\d.]+)(%|px)$/.exec(token);
  if (!m) return free / 2;
  const v = Number(m[1]);
  return m[2] === "%" ? (free * v) / 100 : v;
}

/**
 * The affine map from frame pixels to canvas pixels.
 *
 * The frame the server saw is the whole source image scaled to `frameW × frameH`, so frame
 * pixels map onto the content rectangle by a plain scale. `offsetX/Y` is where the media
 * element's box sits relative to the canvas (CSS px); `pixelRatio` is canvas pixels per CSS
 * pixel (the device pixel ratio, or exactly canvas.width / its CSS width).
 */
export function frameToCanvas(rect, frameW, frameH, pixelRatio = 1, offsetX = 0, offsetY = 0) {
  const sx = (rect.width / frameW) * pixelRatio;
  const sy = (rect.height / frameH) * pixelRatio;
  const ox = (rect.x + offsetX) * pixelRatio;
  const oy = (rect.y + offsetY) * pixelRatio;
  return {
    sx,
    sy,
    ox,
    oy,
    /** @param {number[]} box [x1, y1, x2, y2] in frame pixels → same in canvas pixels */
    box(box) {
      return [ox + box[0] * sx, oy + box[1] * sy, ox + box[2] * sx, oy + box[3] * sy];
    },
  };
}

/** Size to send: the source scaled so its long side is at most `maxSide` (never enlarged). */
export function sendSize(srcW, srcH, maxSide) {
  if (!(maxSide > 0) || Math.max(srcW, srcH) <= maxSide) {
    return { width: Math.round(srcW), height: Math.round(srcH) };
  }
  const scale = maxSide / Math.max(srcW, srcH);
  return {
    width: Math.max(1, Math.round(srcW * scale)),
    height: Math.max(1, Math.round(srcH * scale)),
  };
}
