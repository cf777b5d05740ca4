// One WebSocket session with the server that survives restarts and network drops:
// reconnect with exponential backoff and jitter, resume with the token from `hello` (or from
// `closing`), an application-level ping that notices a dead network, and a plain-words
// reason when the server refuses (docs/protocol.md).

import { PROTOCOL_VERSION, pingMessage } from "./protocol.js";

// The server's subprotocol and its own close codes (docs/protocol.md, "Close codes").
const SUBPROTOCOL = "edge-vision";
const CLOSE_SUPERSEDED = 4000;
const CLOSE_TOKEN_EXPIRED = 4001;

const BACKOFF_FIRST_MS = 250;
const BACKOFF_MAX_MS = 8000;
const PING_EVERY_MS = 5000;
// Without any message for this long the network is presumed gone: browsers may keep a dead
// TCP connection "open" for minutes.
const SILENCE_LIMIT_MS = 15000;

/**
 * @typedef {{kind: "idle"|"connecting"|"open"|"waiting"|"refused"|"stopped",
 *            text: string, attempt?: number, retryAt?: number}} ConnectionState
 */

export class SessionConnection {
  /**
   * @param {string} url ws:// or wss:// URL of /ws
   * @param {{onHello: (hello: object) => void, onMessage: (msg: object) => void,
   *          onState: (state: ConnectionState) => void, onClosed: () => void}} handlers
   * @param {string|null} token access token or API key (docs/security.md), or null
   */
  constructor(url, handlers, token = null) {
    this.url = url;
    this.handlers = handlers;
    this.token = token;
    this.ws = null;
    this.resumeToken = null;
    this.hello = null;
    this.attempt = 0;
    this.retryTimer = null;
    this.pingTimer = null;
    this.lastReceivedAt = 0;
    this.stopped = true;
    this.state = { kind: "idle", text: "not connected" };
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN && this.hello !== null;
  }

  start() {
    this.stopped = false;
    if (!this.ws && !this.retryTimer) this._open();
  }

  /** Connect now, skipping whatever backoff is left (the Reconnect button, `online`). */
  reconnectNow() {
    this.stopped = false;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.ws) {
      this._drop(4000, "reconnect requested");
    }
    this.attempt = 0;
    this._open();
  }

  /** Close for good: code 1000 ends the session on the server (not resumable). */
  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.ws) this._drop(1000, "page closed");
    this._setState({ kind: "stopped", text: "disconnected" });
  }

  /** Send if open; false otherwise (the caller drops the frame, it never queues). */
  send(data) {
    if (!this.isOpen) return false;
    this.ws.send(data);
    return true;
  }

  _setState(state) {
    this.state = state;
    this.handlers.onState(state);
  }

  _open() {
    const url = new URL(this.url);
    url.searchParams.set("protocol", String(PROTOCOL_VERSION)); // the version this page speaks
    // A browser cannot set headers on a WebSocket: the credential and the resume token
    // travel as Sec-WebSocket-Protocol entries next to the real subprotocol, which is the
    // only one the server echoes (docs/protocol.md, "Authentication"). Nothing secret goes
    // into the URL, so no access log keeps it.
    const protocols = [SUBPROTOCOL];
    if (this.token) protocols.push(`${SUBPROTOCOL}.token.${this.token}`);
    if (this.resumeToken) protocols.push(`${SUBPROTOCOL}.resume.${this.resumeToken}`);
    this._setState({
      kind: "connecting",
      text: this.attempt ? `connecting (attempt ${this.attempt + 1})` : "connecting",
      attempt: this.attempt,
    });
    let ws;
    try {
      ws = new WebSocket(url.href, protocols);
    } catch (e) {
      // Only a malformed URL throws here; retrying would not help.
      this._setState({ kind: "refused", text: `bad server address: ${e.message}` });
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let opened = false;
    let closingHint = false;
    ws.onopen = () => {
      opened = true;
      this.lastReceivedAt = performance.now();
    };
    ws.onmessage = (ev) => {
      if (ws !== this.ws) return;
      this.lastReceivedAt = performance.now();
      let msg;
      try {
        msg = JSON.parse(typeof ev.data === "string" ? ev.data : new TextDecoder().decode(ev.data));
      } catch {
        return; // the server only sends JSON; anything else is not ours to act on
      }
      if (msg.type === "hello") {
        this._onHello(msg);
      } else if (msg.type === "closing") {
        closingHint = true;
        if (msg.resume_token) this.resumeToken = msg.resume_token;
        this._setState({ kind: "connecting", text: "server is restarting; will resume" });
      } else {
        this.handlers.onMessage(msg);
      }
    };
    // The close event always follows an error; the browser has already logged the cause.
    ws.onerror = () => {};
    ws.onclose = (ev) => {
      if (ws !== this.ws) return;
      this._closed();
      if (this.stopped) return;
      if (!opened) {
        this._diagnoseRefusal();
        return;
      }
      if (ev.code === CLOSE_SUPERSEDED) {
        // Another tab or device took this session over; fighting back would ping-pong.
        this._setState({
          kind: "refused",
          text: "this session was taken over by another connection; press Reconnect",
        });
        return;
      }
      if (ev.code === CLOSE_TOKEN_EXPIRED) {
        this._setState({
          kind: "refused",
          text: "the access token expired; open the page with a fresh #token=… and press Reconnect",
        });
        return;
      }
      const why = describeClose(ev.code, ev.reason);
      if (closingHint) this.attempt = 0;
      this._scheduleRetry(why);
    };
  }

  _onHello(hello) {
    const wasResuming = this.resumeToken !== null;
    this.hello = hello;
    this.resumeToken = hello.resume_token;
    this.attempt = 0;
    clearInterval(this.pingTimer);
    this.pingTimer = setInterval(() => this._ping(), PING_EVERY_MS);
    this._ping();
    let text = `live · session ${hello.session_id}`;
    if (hello.resumed) text += " (resumed)";
    else if (wasResuming) text += " (new session: the server did not know the old one)";
    this._setState({ kind: "open", text });
    this.handlers.onHello(hello);
  }

  _ping() {
    if (!this.isOpen) return;
    if (performance.now() - this.lastReceivedAt > SILENCE_LIMIT_MS) {
      this._drop(4000, "no reply from server");
      this._closed();
      this._scheduleRetry("the server stopped answering");
      return;
    }
    this.ws.send(pingMessage({ t: performance.now() }));
  }

  _drop(code, reason) {
    const ws = this.ws;
    this.ws = null;
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    try {
      ws.close(code, reason);
    } catch {
      // already closing
    }
  }

  _closed() {
    this.ws = null;
    this.hello = null;
    clearInterval(this.pingTimer);
    this.pingTimer = null;
    this.handlers.onClosed();
  }

  _scheduleRetry(why, delayMs = null) {
    if (this.stopped) return;
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** this.attempt);
    // Jitter spreads the reconnects of many clients after a restart.
    const delay = delayMs ?? base * (0.7 + 0.6 * Math.random());
    this.attempt += 1;
    const retryAt = performance.now() + delay;
    this._setState({ kind: "waiting", text: why, attempt: this.attempt, retryAt });
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      if (!this.stopped && !this.ws) this._open();
    }, delay);
  }

  // A browser hides the HTTP status of a refused WebSocket upgrade. The server runs the
  // same checks for a plain GET of the same URL with the same credential (as a header,
  // which fetch can set) and answers with the status and one line saying why: 401/403
  // (credential, scope, origin), 503 (warming up, shutting down, a connection limit by
  // name), 400 (protocol version), or 426 when nothing would refuse this page now.
  async _diagnoseRefusal() {
    const httpUrl = new URL(this.url);
    httpUrl.protocol = httpUrl.protocol === "wss:" ? "https:" : "http:";
    httpUrl.search = "";
    httpUrl.searchParams.set("protocol", String(PROTOCOL_VERSION));
    let why = "server unreachable";
    let fatal = false;
    if (httpUrl.origin === location.origin) {
      try {
        const headers = this.token ? { Authorization: `Bearer ${this.token}` } : {};
        const res = await fetch(httpUrl.href, { cache: "no-store", headers });
        const body = (await res.text()).trim().split("\n")[0].slice(0, 200);
        if (res.status === 401) {
          why = `refused: not authorised (401: ${body || "credentials required"})`;
          fatal = true;
        } else if (res.status === 403) {
          why = `refused: forbidden (403: ${body || "forbidden"})`;
          fatal = true;
        } else if (res.status === 503 || res.status === 429) {
          why = `server busy: ${body || res.statusText}`;
        } else if (res.status === 426) {
          why = "the connection failed during the handshake";
        } else {
          why = `refused: HTTP ${res.status}${body ? ` ${body}` : ""}`;
        }
      } catch {
        why = "server unreachable";
      }
    }
    if (this.stopped || this.ws) return;
    if (fatal) {
      this._setState({ kind: "refused", text: `${why}; press Reconnect after fixing it` });
    } else {
      this._scheduleRetry(why);
    }
  }
}

function describeClose(code, reason) {
  switch (code) {
    case 1001:
      return reason ? `server closed: ${reason}` : "server went away";
    case 1008:
      return `server closed the connection: ${reason || "policy"}`;
    case 4002:
      return "the server closed the connection: this page stopped reading results";
    case 4003:
      return "closed after a quiet spell (idle timeout)";
    case 1009:
      return "a frame was larger than the server accepts; lower the quality or send size";
    case 1006:
      return "connection lost";
    default:
      return reason ? `closed (${code}): ${reason}` : `closed (${code})`;
  }
}
