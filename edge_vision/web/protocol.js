// The client side of docs/protocol.md (version 2): frame messages and session settings.

/** The version this page speaks; sent as `?protocol=` (docs/protocol.md, "Versions"). */
export const PROTOCOL_VERSION = 2;

/**
 * A binary `frame` message: uint32 big-endian header length, the UTF-8 JSON header
 * `{"type":"frame","id":…,"ts":…}`, then the JPEG bytes (docs/protocol.md, "frame as binary").
 * @param {number|string} id
 * @param {number} ts
 * @param {ArrayBuffer} jpeg
 * @returns {Uint8Array}
 */
export function encodeBinaryFrame(id, ts, jpeg) {
  const header = new TextEncoder().encode(JSON.stringify({ type: "frame", id, ts }));
  const msg = new Uint8Array(4 + header.length + jpeg.byteLength);
  new DataView(msg.buffer).setUint32(0, header.length); // DataView writes big-endian by default
  msg.set(header, 4);
  msg.set(new Uint8Array(jpeg), 4 + header.length);
  return msg;
}

/**
 * A text `frame` message with the image as a data URL, which the server accepts as is
 * (docs/protocol.md, "frame as text"). Costs a third more bytes than the binary form.
 * @param {number|string} id
 * @param {number} ts
 * @param {Blob} jpeg
 * @returns {Promise<string>}
 */
export function encodeJsonFrame(id, ts, jpeg) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(JSON.stringify({ type: "frame", id, ts, image: reader.result }));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(jpeg);
  });
}

/**
 * The `settings` message; `classes: null` clears the class filter. `extra`: the settings
 * since protocol 2 the server announced (`track`, `input_size`, `read`), sent as given.
 */
export function settingsMessage(confidence, classes, extra = {}) {
  return JSON.stringify({ type: "settings", confidence, classes, ...extra });
}

export function pingMessage(payload) {
  return JSON.stringify({ type: "ping", payload });
}

/** Same list of class indices, order ignored; `null` (no filter) equals only `null`. */
export function sameClasses(a, b) {
  if (a === null || b === null || a === undefined || b === undefined) {
    return (a ?? null) === (b ?? null);
  }
  if (a.length !== b.length) return false;
  const sa = [...a].sort((x, y) => x - y);
  const sb = [...b].sort((x, y) => x - y);
  return sa.every((v, i) => v === sb[i]);
}
