// The protocol without I/O (docs/protocol.md): the handshake's URL and subprotocol entries,
// frame messages in both forms, and which typed error a refusal or a close stands for.
// Pure functions: the client drives them, the browser tests call them with literal inputs.

import {
  AccessForbidden,
  AuthenticationFailed,
  ConnectionClosed,
  ConnectionLost,
  HandshakeRefused,
  IdleTimeout,
  MessageTooBig,
  ProtocolNotServed,
  ProtocolViolation,
  ServerFailed,
  ServerOverloaded,
  ServerShuttingDown,
  SessionEnded,
  SessionSuperseded,
  SlowClient,
  TokenExpired,
  WrongPath,
} from "./errors.js";

/** The version this client speaks unless told otherwise (hello's `protocol`). */
export const PROTOCOL_VERSION = 3;
/** Every version this client speaks. */
export const PROTOCOLS = Object.freeze([1, 2, 3]);

/** The application's subprotocol; the server echoes only this entry. */
export const SUBPROTOCOL = "edge-vision";
const TOKEN_ENTRY = `${SUBPROTOCOL}.token.`;
const RESUME_ENTRY = `${SUBPROTOCOL}.resume.`;

/**
 * The URL and the `Sec-WebSocket-Protocol` entries of a handshake (docs/protocol.md,
 * "Connecting"). A browser cannot set headers on a WebSocket, so the credential travels as
 * the entry `edge-vision.token.<token>` beside the real subprotocol; since protocol 2 the
 * resume token is an entry too (protocol 1: `?resume=`), so no access log keeps either.
 * @param {string} url the node's ws:// or wss:// URL of /ws
 * @param {{protocol: number, mode?: string|null, token?: string|null,
 *          resumeToken?: string|null}} options
 * @returns {{url: string, protocols: string[]}}
 */
export function handshake(url, { protocol, mode = null, token = null, resumeToken = null }) {
  const u = new URL(url);
  u.searchParams.set("protocol", String(protocol));
  if (mode) u.searchParams.set("mode", mode);
  const protocols = [SUBPROTOCOL];
  if (token) protocols.push(TOKEN_ENTRY + token);
  if (resumeToken) {
    if (protocol >= 2) protocols.push(RESUME_ENTRY + resumeToken);
    else u.searchParams.set("resume", resumeToken);
  }
  return { url: u.href, protocols };
}

/**
 * The plain-HTTP twin of a WebSocket URL, asked with GET after a refused upgrade: the
 * server runs the same checks and answers with the status and one line saying why, which a
 * browser hides from a failed WebSocket (docs/protocol.md, "Refusals").
 * @param {string} url the URL the socket was opened with
 * @returns {string}
 */
export function refusalCheckUrl(url) {
  const u = new URL(url);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.searchParams.delete("resume"); // a token kept out of a second request
  return u.href;
}

/**
 * Where an edge_vision node at `url`'s address serves its WebSocket: path /ws.
 * @param {string} url
 */
export function nodeWsUrl(url) {
  const u = new URL(url);
  return `${u.protocol}//${u.host}/ws`;
}

/**
 * HTTP 200 or 404 instead of the upgrade: the path is the overlay page, another page, or
 * nothing. The message names the node's /ws and never repeats a page's HTML.
 * @param {string} url
 * @param {number} status
 * @returns {WrongPath}
 */
export function wrongPath(url, status) {
  const ws = nodeWsUrl(url);
  const path = new URL(url).pathname;
  const atWs = path.replace(/\/+$/, "").endsWith("/ws");
  let message;
  if (path === "" || path === "/") {
    message = `${url} is the overlay page; the WebSocket is at ${ws}`;
  } else if (status === 200 && atWs) {
    message =
      `${url} answered with a page (HTTP 200), not the WebSocket upgrade: is an edge_vision ` +
      "node there, or does a proxy in front drop the Upgrade header?";
  } else if (status === 200) {
    message = `${url} is a page (HTTP 200), not the WebSocket; it is at ${ws}`;
  } else if (atWs) {
    message =
      `nothing serves a WebSocket at ${url} (HTTP 404): is an edge_vision node there, or ` +
      "does a proxy in front serve its /ws under another path?";
  } else {
    message = `nothing serves a WebSocket at ${url} (HTTP 404); it is at ${ws}`;
  }
  return new WrongPath(url, status, message, ws);
}

/**
 * A refused upgrade (HTTP `status` with the server's one-line `body`) as its error.
 * @param {string} url
 * @param {number} status
 * @param {string} body
 * @returns {HandshakeRefused}
 */
export function refusalError(url, status, body) {
  if (status === 200 || status === 404) return wrongPath(url, status);
  if (status === 401) return new AuthenticationFailed(url, status, body);
  if (status === 403) return new AccessForbidden(url, status, body);
  if (status === 400 && body.includes("unsupported_protocol")) {
    let served = [];
    try {
      served = JSON.parse(body).protocols.map(Number).filter(Number.isInteger);
    } catch {
      // a body that is not the documented JSON: the versions stay unknown
    }
    return new ProtocolNotServed(url, status, body, served);
  }
  return new HandshakeRefused(url, status, body);
}

/** @typedef {new (code: number, reason: string) => ConnectionClosed} ClosedClass */
const CLOSED_BY_CODE = new Map(
  /** @type {Array<[number, ClosedClass]>} */ ([
  [1000, SessionEnded],
  [1002, ProtocolViolation],
  [1007, ProtocolViolation],
  [1009, MessageTooBig],
  [4000, SessionSuperseded],
  [4001, TokenExpired],
  [4002, SlowClient],
  [4003, IdleTimeout],
  // RFC 6455 section 7.4.1 codes edge_vision does not send, but a proxy or a peer may.
  [1011, ServerFailed],
  [1013, ServerOverloaded],
  ]),
);

/**
 * The typed error a close with `code` and `reason` stands for (docs/protocol.md, "Close
 * codes"). `closingToken`: the resume token of a `closing` message that came first (a
 * shutdown), else null. Protocol 1's codes are told apart as the Python client does.
 * @param {number|null} code
 * @param {string} reason
 * @param {string|null} closingToken
 * @returns {ConnectionClosed}
 */
export function classifyClose(code, reason, closingToken) {
  if (closingToken !== null && code === 1001) {
    return new ServerShuttingDown(code, reason || "server shutting down", closingToken);
  }
  if (code === null || code === 1006 || code === 1005) {
    return new ConnectionLost(code, reason || "the connection ended without a close frame");
  }
  if (code === 1001) return new IdleTimeout(code, reason); // protocol 1: idle (no closing)
  if (code === 1008) {
    // protocol 1 used 1008 for several reasons; its text tells them apart
    if (reason.includes("resumed elsewhere")) return new SessionSuperseded(code, reason);
    if (reason.includes("not reading")) return new SlowClient(code, reason);
    return new ProtocolViolation(code, reason);
  }
  const Closed = CLOSED_BY_CODE.get(code) ?? ConnectionClosed;
  return new Closed(code, reason);
}

/**
 * A binary `frame` message: uint32 big-endian header length, the UTF-8 JSON header
 * `{"type":"frame","id":…,"ts":…}`, then the image bytes (docs/protocol.md).
 * @param {number|string} id
 * @param {number|null} ts
 * @param {Uint8Array} image JPEG or PNG bytes
 * @returns {Uint8Array}
 */
export function encodeBinaryFrame(id, ts, image) {
  const header = new TextEncoder().encode(JSON.stringify({ type: "frame", id, ts }));
  const msg = new Uint8Array(4 + header.length + image.byteLength);
  new DataView(msg.buffer).setUint32(0, header.length); // DataView writes big-endian by default
  msg.set(header, 4);
  msg.set(image, 4 + header.length);
  return msg;
}

/**
 * A text `frame` message, the image as base64 (docs/protocol.md, "frame as text"): a third
 * larger than the binary form, for links that carry only text.
 * @param {number|string} id
 * @param {number|null} ts
 * @param {Uint8Array} image
 * @returns {string}
 */
export function encodeJsonFrame(id, ts, image) {
  return JSON.stringify({ type: "frame", id, ts, image: base64(image) });
}

/**
 * Standard base64 (RFC 4648 section 4) of `bytes`.
 * @param {Uint8Array} bytes
 */
export function base64(bytes) {
  let text = "";
  const chunk = 0x8000; // String.fromCharCode takes its arguments on the stack
  for (let i = 0; i < bytes.length; i += chunk) {
    text += String.fromCharCode.apply(null, Array.from(bytes.subarray(i, i + chunk)));
  }
  return btoa(text);
}

/**
 * Seconds from a `Retry-After: <seconds>` value (RFC 9110 section 10.2.3), in ms; null for
 * none or an HTTP date (then the client backs off on its own).
 * @param {string|null} value
 * @returns {number|null}
 */
export function retryAfterMs(value) {
  if (value === null || value.trim() === "") return null;
  const seconds = Number(value);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : null;
}

/**
 * The wait before connect attempt `attempt` + 1 (0-based): `firstMs` doubling to `maxMs`,
 * spread by ±30 % so many clients do not come back at the same instant; a server's
 * Retry-After (ms) wins, within `maxMs`.
 * @param {number} attempt
 * @param {{firstMs: number, maxMs: number, retryAfter?: number|null, random?: () => number}} o
 * @returns {number}
 */
export function backoffMs(attempt, { firstMs, maxMs, retryAfter = null, random = Math.random }) {
  if (retryAfter !== null) return Math.min(Math.max(retryAfter, 50), maxMs);
  const base = Math.min(maxMs, firstMs * 2 ** attempt);
  return base * (0.7 + 0.6 * random());
}
