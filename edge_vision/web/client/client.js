// The connection: EdgeVisionClient, its handshake, retries, resume, liveness and the
// matching of answers to frames. The same contract as the Python client (docs/client.md);
// what differs for a browser is in docs/js-client.md.

import {
  ConnectFailed,
  ConnectionClosed,
  ConnectionLost,
  FrameDropped,
  FrameRejected,
  HandshakeRefused,
  MessageTooBig,
  ProtocolNotServed,
  ProtocolViolation,
  ServerUnavailable,
  ServerUnreachable,
  SessionEnded,
  TokenExpired,
} from "./errors.js";
import {
  PROTOCOLS,
  PROTOCOL_VERSION,
  backoffMs,
  classifyClose,
  encodeBinaryFrame,
  encodeJsonFrame,
  handshake,
  refusalCheckUrl,
  refusalError,
  retryAfterMs,
} from "./wire.js";

/** @typedef {import("./index.js").ClientOptions} ClientOptions */
/** @typedef {import("./index.js").ClientState} ClientState */
/** @typedef {import("./index.js").Hello} Hello */
/** @typedef {import("./index.js").Result} Result */
/** @typedef {import("./index.js").Answer} Answer */
/** @typedef {import("./index.js").EdgeEvent} EdgeEvent */
/** @typedef {import("./index.js").FrameId} FrameId */
/** @typedef {import("./index.js").FrameImage} FrameImage */
/** @typedef {import("./index.js").SendOptions} SendOptions */
/** @typedef {import("./index.js").SentFrame} SentFrame */
/** @typedef {import("./index.js").Settings} Settings */
/** @typedef {import("./index.js").SettingsChange} SettingsChange */
/** @typedef {import("./index.js").DropCause} DropCause */
/** @typedef {import("./index.js").ProtocolClientError} ProtocolClientError */
/** @typedef {import("./index.js").EdgeVisionClient} DeclaredClient */

const OPEN = 1; // WebSocket.OPEN, without needing the global
const CLOSE_LEAVE = 4000; // a client's close that keeps its session resumable (1000 ends it)

/** @typedef {{resume: boolean, retryMs: number, backoffFirstMs: number, backoffMaxMs: number,
 *   openTimeoutMs: number, quality: number, replyTimeoutMs: number, pingIntervalMs: number,
 *   silenceLimitMs: number, resultsBuffer: number}} Defaults */

/** @type {Defaults} */
const DEFAULTS = {
  resume: true,
  retryMs: 30000,
  backoffFirstMs: 250,
  backoffMaxMs: 5000,
  openTimeoutMs: 10000,
  quality: 0.85,
  replyTimeoutMs: 30000,
  pingIntervalMs: 5000,
  silenceLimitMs: 15000,
  resultsBuffer: 1024,
};

const clock = () => (typeof performance !== "undefined" ? performance.now() : Date.now());

/**
 * @template T
 * @typedef {{promise: Promise<T>, resolve: (v: T) => void, reject: (e: unknown) => void}} Deferred
 */

/**
 * A promise with its settle functions. It is marked handled at once: a frame nobody awaits
 * (dropped, say) logs no unhandled rejection; whoever awaits it still gets the error.
 * @template T
 * @returns {Deferred<T>}
 */
function deferred() {
  /** @type {(v: T) => void} */
  let resolve = () => {};
  /** @type {(e: unknown) => void} */
  let reject = () => {};
  const promise = new Promise((yes, no) => {
    resolve = yes;
    reject = no;
  });
  promise.catch(() => {});
  return { promise, resolve, reject };
}

/** Something to wait on until the next `notify()`. */
class Signal {
  constructor() {
    /** @type {Array<() => void>} */
    this.waiting = [];
  }

  wait() {
    return new Promise((resolve) => this.waiting.push(() => resolve(undefined)));
  }

  notify() {
    const waiting = this.waiting;
    this.waiting = [];
    for (const wake of waiting) wake();
  }
}

/** A failed attempt: the error, whether another attempt may help, and how long to wait. */
class AttemptFailed {
  /**
   * @param {ProtocolClientError} error
   * @param {boolean} retryable
   * @param {number|null} [retryAfter] ms, from a Retry-After header
   */
  constructor(error, retryable, retryAfter = null) {
    this.error = error;
    this.retryable = retryable;
    this.retryAfter = retryAfter;
  }
}

/** Another connect (reconnect(), close()) took over: this one stops quietly. */
class Superseded {}

/** What became of the frames sent: sent = answered + dropped + rejected + lost + pending. */
class FrameBooks {
  constructor() {
    this.sent = 0;
    this.answered = 0;
    this.dropped = 0;
    this.rejected = 0;
    this.lost = 0;
    this.unmatched = 0;
  }

  get pending() {
    return this.sent - this.answered - this.dropped - this.rejected - this.lost;
  }
}

/**
 * Call a user's callback; its bug is reported as uncaught, and never stops the client.
 * @param {((...a: any[]) => void) | undefined} fn
 * @param {...unknown} args
 */
function callBack(fn, ...args) {
  if (!fn) return;
  try {
    fn(...args);
  } catch (e) {
    setTimeout(() => {
      throw e;
    });
  }
}

/** @implements {DeclaredClient} the class index.d.ts declares: tsc checks they agree */
export class EdgeVisionClient {
  /** @type {ClientOptions & Defaults} */
  #o;
  /** @type {typeof WebSocket} */
  #WebSocket;
  /** @type {typeof fetch | null} */
  #fetch;
  #protocol = PROTOCOL_VERSION;
  #protocolGiven = false;
  /** @type {WebSocket | null} the open connection */
  #ws = null;
  /** @type {WebSocket | null} a connect attempt in progress */
  #attempt = null;
  /** @type {Hello | null} */
  #hello = null;
  /** @type {ClientState} */
  #state = { kind: "idle" };
  /** @type {string | null} */
  #resumeToken = null;
  /** @type {string | null} */
  #closingToken = null;
  /** @type {Map<FrameId, Deferred<Result>>} */
  #pending = new Map();
  /** @type {Array<Deferred<Settings>>} */
  #settingsWaiting = [];
  /** @type {Array<Deferred<unknown> | null>} null: the client's own ping */
  #pingsWaiting = [];
  /** @type {Answer[]} */
  #answers = [];
  /** @type {EdgeEvent[]} */
  #events = [];
  #changed = new Signal(); // an answer, an event, or the end
  #opened = new Signal(); // open, or the end
  #nextId = 0;
  /** @type {ProtocolClientError | null} the end of this client, until reconnect() */
  #failure = null;
  #closed = false;
  #generation = 0; // each connect run; a superseded one notices and stops
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #sleepTimer = undefined;
  /** @type {(() => void) | null} */
  #wakeSleeper = null;
  /** @type {ReturnType<typeof setInterval> | undefined} */
  #liveness = undefined;
  #lastMessageAt = 0;
  /** @type {((closed: ConnectionClosed) => void) | null} */
  #onSocketClosed = null;

  /** @type {import("./index.js").Books} */
  books = new FrameBooks();
  resumes = 0;
  retries = 0;

  /**
   * @param {string} url the node's ws:// or wss:// URL of /ws
   * @param {ClientOptions} [options]
   */
  constructor(url, options = {}) {
    this.url = url;
    this.#o = { ...DEFAULTS, ...options };
    const WS = options.WebSocket ?? globalThis.WebSocket;
    if (!WS) {
      throw new TypeError("no WebSocket here: pass one, e.g. {WebSocket} from the 'ws' package");
    }
    this.#WebSocket = WS;
    this.#fetch = options.fetch ?? (typeof fetch === "function" ? fetch.bind(globalThis) : null);
    if (options.protocol !== undefined) {
      if (!PROTOCOLS.includes(options.protocol)) {
        const speaks = PROTOCOLS.join(", ");
        throw new RangeError(`protocol ${options.protocol} is not one this client speaks: ${speaks}`);
      }
      this.#protocol = options.protocol;
      this.#protocolGiven = true;
    }
    this.#resumeToken = options.resumeToken ?? null;
  }

  get hello() {
    return this.#hello;
  }

  get state() {
    return this.#state;
  }

  get isOpen() {
    return (
      this.#ws !== null && this.#ws.readyState === OPEN && this.#hello !== null && !this.#failure
    );
  }

  get pending() {
    return this.#pending.size;
  }

  // -- connecting ---------------------------------------------------------------------

  async connect() {
    if (this.#state.kind !== "idle") {
      throw new Error("connect() was called already; reconnect() connects again");
    }
    this.#run(++this.#generation, Boolean(this.#resumeToken));
    for (;;) {
      if (this.#failure) throw this.#failure;
      if (this.isOpen) return /** @type {Hello} */ (this.#hello);
      await this.#opened.wait();
    }
  }

  reconnect() {
    this.#stopAll(new ConnectionLost(null, "reconnect requested"));
    this.#closed = false;
    this.#failure = null;
    this.#run(this.#generation, Boolean(this.#resumeToken));
  }

  /**
   * A run: connect (retrying), then follow the connection, resuming after each resumable
   * close, until the session ends (or another run supersedes it).
   * @param {number} generation
   * @param {boolean} resuming
   */
  async #run(generation, resuming) {
    /** @type {ConnectionClosed | null} */
    let lastClose = null;
    for (;;) {
      try {
        await this.#openWithRetry(generation, resuming);
      } catch (e) {
        if (e instanceof Superseded) return;
        // A resume that failed ends the session with the close that made it try.
        this.#finish(lastClose ?? /** @type {ProtocolClientError} */ (e));
        return;
      }
      if (lastClose !== null) this.resumes += 1;
      /** @type {ConnectionClosed} */
      const closed = await new Promise((resolve) => {
        this.#onSocketClosed = resolve;
      });
      if (generation !== this.#generation) return;
      this.#settleAll(closed);
      if (!this.#shouldResume(closed)) {
        this.#finish(closed);
        return;
      }
      if (closed instanceof ConnectionClosed && "resumeToken" in closed && closed.resumeToken) {
        this.#resumeToken = String(closed.resumeToken);
      }
      lastClose = closed;
      resuming = Boolean(this.#resumeToken);
      // A short, jittered wait first: the clients of a node that restarts do not all come
      // back at the same instant.
      const wait = backoffMs(0, { firstMs: this.#o.backoffFirstMs, maxMs: this.#o.backoffMaxMs });
      this.#setState({ kind: "waiting", attempt: 0, retryAt: Date.now() + wait, error: closed });
      await this.#sleep(wait);
      if (generation !== this.#generation) return;
    }
  }

  /** @param {ConnectionClosed} closed */
  #shouldResume(closed) {
    if (!this.#o.resume || this.#closed) return false;
    if (closed instanceof TokenExpired) return typeof this.#o.token === "function";
    return closed.resumable;
  }

  /**
   * Attempts until one opens, within the retry budget.
   * @param {number} generation
   * @param {boolean} resuming
   * @returns {Promise<Hello>}
   */
  async #openWithRetry(generation, resuming) {
    const started = clock();
    let attempt = 0;
    for (;;) {
      this.#setState({ kind: "connecting", attempt, resuming });
      /** @type {AttemptFailed} */
      let failed;
      try {
        return await this.#openOnce(generation, resuming);
      } catch (e) {
        if (e instanceof Superseded) throw e;
        failed = /** @type {AttemptFailed} */ (e);
      }
      if (generation !== this.#generation) throw new Superseded();
      const error = failed.error;
      if (error instanceof ProtocolNotServed && !this.#protocolGiven) {
        const common = PROTOCOLS.filter((v) => error.protocols.includes(v));
        if (common.length && Math.max(...common) !== this.#protocol) {
          this.#protocol = Math.max(...common); // an older node: speak its newest version
          continue;
        }
      }
      if (!failed.retryable) throw error;
      const wait = backoffMs(attempt, {
        firstMs: this.#o.backoffFirstMs,
        maxMs: this.#o.backoffMaxMs,
        retryAfter: failed.retryAfter,
      });
      const elapsed = clock() - started;
      if (elapsed + wait > this.#o.retryMs) throw this.#gaveUp(error, elapsed);
      attempt += 1;
      this.retries += 1;
      this.#setState({ kind: "waiting", attempt, retryAt: Date.now() + wait, error });
      await this.#sleep(wait);
      if (generation !== this.#generation) throw new Superseded();
    }
  }

  /**
   * The last failure once the retry budget is spent, saying how long it tried.
   * @param {ProtocolClientError} error
   * @param {number} elapsed ms
   * @returns {ProtocolClientError}
   */
  #gaveUp(error, elapsed) {
    const tried = `tried for ${(elapsed / 1000).toFixed(1)} s (retryMs ${this.#o.retryMs})`;
    if (error instanceof ServerUnavailable) {
      return new ServerUnavailable(
        error.url,
        error.status,
        error.body,
        `the server at ${error.url} still refuses the WebSocket (HTTP ${error.status}: ` +
          `${error.body || "service unavailable"}); ${tried}: it is warming up, at a connection ` +
          "limit or stopping (its /readyz says which); retry later, or give a longer retryMs",
      );
    }
    if (error instanceof ServerUnreachable) {
      return new ServerUnreachable(
        error.url,
        `${error.message}; ${tried}: check the host and port, and that 'edge-vision serve' ` +
          "runs there (its log names the URL to use)",
      );
    }
    return error;
  }

  /**
   * @param {number} ms
   * @returns {Promise<void>}
   */
  #sleep(ms) {
    return new Promise((resolve) => {
      this.#wakeSleeper = () => {
        clearTimeout(this.#sleepTimer);
        this.#wakeSleeper = null;
        resolve(undefined);
      };
      this.#sleepTimer = setTimeout(this.#wakeSleeper, ms);
    });
  }

  async #token() {
    const given = this.#o.token;
    return typeof given === "function" ? await given() : (given ?? null);
  }

  /**
   * One attempt: resolves with the hello (the socket adopted), or rejects with an
   * AttemptFailed (or Superseded).
   * @param {number} generation
   * @param {boolean} resuming
   * @returns {Promise<Hello>}
   */
  async #openOnce(generation, resuming) {
    const token = await this.#token();
    if (generation !== this.#generation) throw new Superseded();
    const { url, protocols } = handshake(this.url, {
      protocol: this.#protocol,
      mode: this.#o.mode,
      token,
      resumeToken: resuming ? this.#resumeToken : null,
    });
    let ws;
    try {
      ws = new this.#WebSocket(url, protocols);
    } catch (e) {
      // Only an address that is no WebSocket URL throws here; retrying would not help.
      const why = e instanceof Error ? e.message : String(e);
      const error = new ConnectFailed(this.url, `cannot connect to ${this.url}: ${why}`);
      throw new AttemptFailed(error, false);
    }
    ws.binaryType = "arraybuffer";
    this.#attempt = ws;
    return new Promise((resolve, reject) => {
      let opened = false;
      let closingToken = /** @type {string|null} */ (null);
      const timer = setTimeout(() => {
        detach(ws);
        reject(
          new AttemptFailed(
            new ServerUnreachable(
              this.url,
              `no answer from ${this.url} within ${this.#o.openTimeoutMs / 1000} s`,
            ),
            true,
          ),
        );
      }, this.#o.openTimeoutMs);
      ws.onopen = () => {
        opened = true;
      };
      ws.onerror = () => {}; // a close event follows; the browser has logged the cause
      ws.onmessage = (ev) => {
        const msg = parse(ev.data);
        if (msg && msg.type === "closing") {
          closingToken = typeof msg.resume_token === "string" ? msg.resume_token : "";
          return;
        }
        clearTimeout(timer);
        if (generation !== this.#generation) {
          detach(ws);
          reject(new Superseded());
          return;
        }
        if (!msg || msg.type !== "hello") {
          detach(ws, 1002, "expected hello");
          const why = `the server at ${this.url} sent no hello first`;
          const error = new ProtocolViolation(1002, why);
          reject(new AttemptFailed(error, false));
          return;
        }
        const hello = /** @type {Hello} */ (msg);
        if (!PROTOCOLS.includes(hello.protocol)) {
          detach(ws);
          const served = hello.protocols ?? [];
          const error = new ProtocolNotServed(this.url, 200, "hello names another version", served);
          reject(new AttemptFailed(error, false));
          return;
        }
        this.#adopt(ws, hello, resuming);
        resolve(hello);
      };
      ws.onclose = (ev) => {
        clearTimeout(timer);
        if (this.#attempt === ws) this.#attempt = null;
        if (generation !== this.#generation) {
          reject(new Superseded());
          return;
        }
        if (!opened) {
          this.#whyRefused(url, token).then(reject);
          return;
        }
        const closed = classifyClose(ev.code, ev.reason, closingToken);
        if (closingToken) this.#resumeToken = closingToken;
        reject(new AttemptFailed(closed, closed.resumable && !(closed instanceof TokenExpired)));
      };
    });
  }

  // A browser hides the HTTP status of a refused upgrade. The server runs the same checks
  // for a plain GET of the same URL with the same credential (as a header, which fetch can
  // set) and answers with the status and one line saying why: 401/403 (credential, scope,
  // origin), 503 (warming up, shutting down, a limit by name), 400 (version), 200/404 (not
  // the WebSocket's path), or 426 when nothing would refuse it now.
  /**
   * @param {string} url
   * @param {string|null} token
   * @returns {Promise<AttemptFailed>}
   */
  async #whyRefused(url, token) {
    const where = this.url;
    const unreachable = (/** @type {string} */ why) => {
      const error = new ServerUnreachable(where, `cannot reach the server at ${where}${why}`);
      return new AttemptFailed(error, true);
    };
    if (!this.#fetch) return unreachable("");
    let res;
    try {
      const headers = token ? { Authorization: `Bearer ${token}` } : undefined;
      res = await this.#fetch(refusalCheckUrl(url), { cache: "no-store", headers });
    } catch {
      // Refused, no route, or another origin without CORS: fetch cannot tell which.
      const page = typeof location !== "undefined" ? location.origin : null;
      const other = page !== null && new URL(refusalCheckUrl(url)).origin !== page;
      return unreachable(other ? " (or it refused, and from another origin cannot say why)" : "");
    }
    const wrong = res.status === 200 || res.status === 404; // a page's HTML says nothing here
    const text = wrong ? "" : await res.text().catch(() => "");
    const body = text.trim().split("\n")[0].slice(0, 300);
    if (res.status === 503 || res.status === 429) {
      const error = new ServerUnavailable(where, res.status, body || res.statusText);
      return new AttemptFailed(error, true, retryAfterMs(res.headers.get("Retry-After")));
    }
    if (res.status === 426) return unreachable(": the connection failed during the handshake");
    return new AttemptFailed(refusalError(where, res.status, body), false);
  }

  /**
   * The attempt's socket becomes the connection.
   * @param {WebSocket} ws
   * @param {Hello} hello
   * @param {boolean} resuming
   */
  #adopt(ws, hello, resuming) {
    this.#attempt = null;
    this.#ws = ws;
    this.#hello = hello;
    this.#resumeToken = hello.resume_token;
    this.#closingToken = null;
    this.#lastMessageAt = clock();
    ws.onmessage = (ev) => {
      if (ws === this.#ws) this.#dispatch(ev.data);
    };
    ws.onclose = (ev) => {
      if (ws !== this.#ws) return;
      this.#socketGone(classifyClose(ev.code, ev.reason, this.#closingToken));
    };
    this.#startLiveness();
    this.#setState({ kind: "open", hello, resumed: Boolean(hello.resumed), resuming });
    callBack(this.#o.onHello, hello);
    this.#opened.notify();
  }

  /** @param {ConnectionClosed} closed */
  #socketGone(closed) {
    this.#ws = null;
    clearInterval(this.#liveness);
    const tell = this.#onSocketClosed;
    this.#onSocketClosed = null;
    if (tell) tell(closed);
  }

  // Browsers may keep a dead TCP connection "open" for minutes: an application ping every
  // pingIntervalMs, and no message at all for silenceLimitMs counts as a lost connection.
  #startLiveness() {
    clearInterval(this.#liveness);
    const every = this.#o.pingIntervalMs || this.#o.silenceLimitMs / 3;
    if (!(every > 0)) return;
    this.#liveness = setInterval(() => {
      const ws = this.#ws;
      if (!ws || ws.readyState !== OPEN) return;
      if (this.#o.silenceLimitMs > 0 && clock() - this.#lastMessageAt > this.#o.silenceLimitMs) {
        detach(ws, CLOSE_LEAVE, "no message from the server");
        this.#socketGone(new ConnectionLost(null, "the server stopped answering"));
        return;
      }
      if (this.#o.pingIntervalMs > 0) {
        this.#pingsWaiting.push(null);
        ws.send(JSON.stringify({ type: "ping", payload: { liveness: Date.now() } }));
      }
    }, every);
  }

  // -- sending ------------------------------------------------------------------------

  /** The open socket; during a connect or resume, waits for it; after the end, throws. */
  async #ready() {
    for (;;) {
      if (this.#failure) throw this.#failure;
      if (this.#closed) throw new SessionEnded(1000, "closed by this client");
      if (this.#state.kind === "idle") throw new Error("not connected: call connect() first");
      const ws = this.#ws;
      if (ws !== null && ws.readyState === OPEN && this.#hello !== null) return ws;
      await this.#opened.wait();
    }
  }

  /**
   * @param {FrameImage} image
   * @param {SendOptions} [options]
   * @returns {Promise<SentFrame>}
   */
  async send(image, options = {}) {
    await this.#ready();
    const bytes = await imageBytes(image, options.quality ?? this.#o.quality);
    const hello = /** @type {Hello} */ (this.#hello);
    const limit = hello.limits?.max_message_bytes ?? 0; // 0: the node did not say
    if (limit && bytes.length > limit) {
      throw new MessageTooBig(null, "", { size: bytes.length, limit });
    }
    const id = options.id ?? this.#nextId++;
    if (this.#pending.has(id)) {
      throw new TypeError(`frame id ${JSON.stringify(id)} is still waiting for its answer`);
    }
    const ts = options.ts === undefined ? Date.now() : options.ts;
    const features = hello.features ?? ["binary_frames"];
    const wire =
      options.wire ?? this.#o.wire ?? (features.includes("binary_frames") ? "binary" : "json");
    const message =
      wire === "binary" ? encodeBinaryFrame(id, ts, bytes) : encodeJsonFrame(id, ts, bytes);
    const size =
      typeof message === "string" ? new TextEncoder().encode(message).length : message.length;
    if (limit && size > limit) throw new MessageTooBig(null, "", { size, limit });
    const ws = await this.#ready(); // encoding awaited: the connection may have changed
    /** @type {Deferred<Result>} */
    const answer = deferred();
    this.#pending.set(id, answer);
    this.books.sent += 1;
    ws.send(message);
    return { id, ts, bytes: size, result: answer.promise };
  }

  /**
   * @param {FrameImage} image
   * @param {SendOptions} [options]
   */
  async detect(image, options = {}) {
    return (await this.send(image, options)).result;
  }

  /**
   * @param {SettingsChange} change
   * @returns {Promise<Settings>}
   */
  async settings(change) {
    const ws = await this.#ready();
    /** @type {Deferred<Settings>} */
    const answer = deferred();
    this.#settingsWaiting.push(answer);
    ws.send(JSON.stringify({ ...change, type: "settings" }));
    return this.#within(answer.promise, "settings");
  }

  /** @param {unknown} [payload] */
  async ping(payload = null) {
    const ws = await this.#ready();
    /** @type {Deferred<unknown>} */
    const answer = deferred();
    this.#pingsWaiting.push(answer);
    ws.send(JSON.stringify({ type: "ping", payload }));
    return this.#within(answer.promise, "ping");
  }

  /**
   * The answer within replyTimeoutMs. One that times out stays queued: its late answer is
   * matched to it and dropped, so answers stay in step with requests (sent in order).
   * @template T
   * @param {Promise<T>} promise
   * @param {string} what
   * @returns {Promise<T>}
   */
  #within(promise, what) {
    const ms = this.#o.replyTimeoutMs;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => {
        const error = new Error(`no answer to ${what} within ${ms / 1000} s`);
        error.name = "TimeoutError";
        reject(error);
      }, ms);
    });
    const answered = Promise.race([promise, late]).finally(() => clearTimeout(timer));
    return /** @type {Promise<T>} */ (answered);
  }

  // -- receiving ----------------------------------------------------------------------

  /** @param {unknown} data */
  #dispatch(data) {
    this.#lastMessageAt = clock();
    const msg = parse(data);
    if (msg === null) return; // the server sends JSON objects only
    if (msg.type !== "hello" && typeof msg.resume_token === "string" && msg.resume_token) {
      this.#resumeToken = msg.resume_token; // `closing`, and a token the server rotated
    }
    switch (msg.type) {
      case "result": {
        const result = /** @type {Result} */ ({ ...msg, receivedAt: clock() });
        this.#settleUntil(result.id, result);
        this.#answer(result);
        break;
      }
      case "error": {
        const id = msg.id ?? null;
        const error = /** @type {import("./index.js").FrameError} */ ({
          type: "error",
          id,
          code: String(msg.code),
          message: String(msg.message),
        });
        const waiting = id === null ? undefined : this.#pending.get(id);
        if (waiting !== undefined && id !== null) {
          this.#pending.delete(id);
          this.books.rejected += 1;
          waiting.reject(new FrameRejected(id, error.code, error.message));
        } else if (error.code === "bad_settings" && this.#settingsWaiting.length) {
          this.#settingsWaiting.shift()?.reject(new FrameRejected(null, error.code, error.message));
        }
        this.#answer(error);
        break;
      }
      case "settings":
        this.#settingsWaiting.shift()?.resolve(/** @type {Settings} */ (msg));
        break;
      case "pong":
        this.#pingsWaiting.shift()?.resolve(msg.payload);
        break;
      case "closing":
        this.#closingToken = typeof msg.resume_token === "string" ? msg.resume_token : "";
        break;
      case "event": {
        const event = /** @type {EdgeEvent} */ (msg);
        this.#events.push(event);
        if (this.#events.length > this.#o.resultsBuffer) this.#events.shift();
        this.#changed.notify();
        callBack(this.#o.onEvent, event);
        break;
      }
      default:
      // A newer server's additions: ignored (docs/protocol.md, "Versions").
    }
  }

  /**
   * Answers come in send order: frames before `id` still waiting were dropped.
   * @param {FrameId} id
   * @param {Result} result
   */
  #settleUntil(id, result) {
    if (!this.#pending.has(id)) {
      this.books.unmatched += 1;
      return;
    }
    for (const [fid, waiting] of this.#pending) {
      this.#pending.delete(fid);
      if (fid === id) {
        this.books.answered += 1;
        waiting.resolve(result);
        return;
      }
      this.books.dropped += 1;
      this.#drop(fid, "latest", waiting);
    }
  }

  /**
   * @param {FrameId} id
   * @param {DropCause} cause
   * @param {Deferred<Result>} waiting
   */
  #drop(id, cause, waiting) {
    callBack(this.#o.onDrop, id, cause);
    waiting.reject(new FrameDropped(id, cause));
  }

  /**
   * The socket closed: frames in flight are lost; settings and pings fail.
   * @param {ConnectionClosed} closed
   */
  #settleAll(closed) {
    for (const [fid, waiting] of this.#pending) {
      this.#pending.delete(fid);
      this.books.lost += 1;
      this.#drop(fid, "closed", waiting);
    }
    for (const waiting of this.#settingsWaiting.splice(0)) waiting.reject(closed);
    for (const waiting of this.#pingsWaiting.splice(0)) waiting?.reject(closed);
  }

  /** @param {Answer} answer */
  #answer(answer) {
    this.#answers.push(answer);
    if (this.#answers.length > this.#o.resultsBuffer) this.#answers.shift();
    this.#changed.notify();
  }

  async *results() {
    yield* this.#follow(this.#answers);
  }

  async *events() {
    yield* this.#follow(this.#events);
  }

  /**
   * @template T
   * @param {T[]} queue
   * @returns {AsyncGenerator<T, void, undefined>}
   */
  async *#follow(queue) {
    for (;;) {
      while (queue.length) yield /** @type {T} */ (queue.shift());
      if (this.#closed) return;
      if (this.#failure) throw this.#failure;
      await this.#changed.wait();
    }
  }

  // -- the end ------------------------------------------------------------------------

  /** @param {ClientState} state */
  #setState(state) {
    this.#state = state;
    callBack(this.#o.onState, state);
  }

  /** @param {ProtocolClientError} error */
  #finish(error) {
    clearInterval(this.#liveness);
    this.#failure = error;
    if (error instanceof ConnectionClosed) this.#settleAll(error);
    else this.#settleAll(new ConnectionLost(null, error.message));
    this.#setState({ kind: "closed", error });
    this.#opened.notify();
    this.#changed.notify();
  }

  /**
   * Stop whatever runs now: the attempt, the wait, the socket (handlers detached).
   * @param {ConnectionClosed} why what becomes of the frames in flight
   */
  #stopAll(why) {
    this.#generation += 1;
    clearInterval(this.#liveness);
    if (this.#wakeSleeper) this.#wakeSleeper();
    if (this.#attempt) detach(this.#attempt, CLOSE_LEAVE, "reconnect requested");
    this.#attempt = null;
    const ws = this.#ws;
    this.#ws = null;
    this.#onSocketClosed = null;
    if (ws) detach(ws, CLOSE_LEAVE, "reconnect requested");
    this.#settleAll(why);
  }

  /** @param {{endSession?: boolean}} [options] */
  async close({ endSession = true } = {}) {
    if (this.#closed) return;
    this.#closed = true;
    const ws = this.#ws;
    this.#ws = null;
    this.#stopAll(new SessionEnded(1000, "closed by this client"));
    if (endSession) this.#resumeToken = null;
    if (ws && ws.readyState <= OPEN) {
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, 5000);
        ws.onclose = () => {
          clearTimeout(timer);
          resolve(undefined);
        };
        ws.close(endSession ? 1000 : CLOSE_LEAVE, endSession ? "session ended" : "leaving");
      });
    }
    this.#finish(new SessionEnded(1000, "closed by this client"));
  }
}

/**
 * Let a socket go: no more events from it, closed with `code` unless already closing.
 * @param {WebSocket} ws
 * @param {number} [code]
 * @param {string} [reason]
 */
function detach(ws, code = CLOSE_LEAVE, reason = "") {
  ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
  if (ws.readyState <= OPEN) {
    try {
      ws.close(code, reason);
    } catch {
      // already closing
    }
  }
}

/**
 * A server message as an object; null for anything that is not a JSON object.
 * @param {unknown} data
 * @returns {Record<string, any> | null}
 */
function parse(data) {
  try {
    const bytes = /** @type {ArrayBuffer} */ (data);
    const text = typeof data === "string" ? data : new TextDecoder().decode(bytes);
    const msg = JSON.parse(text);
    return msg !== null && typeof msg === "object" && !Array.isArray(msg) ? msg : null;
  } catch {
    return null;
  }
}

/**
 * The bytes of a frame: JPEG or PNG bytes as given, a canvas encoded to JPEG.
 * @param {FrameImage} image
 * @param {number} quality
 * @returns {Promise<Uint8Array>}
 */
async function imageBytes(image, quality) {
  if (image instanceof ArrayBuffer) return new Uint8Array(image);
  if (ArrayBuffer.isView(image)) {
    return new Uint8Array(image.buffer, image.byteOffset, image.byteLength);
  }
  /** @type {Blob} */
  let blob;
  if ("convertToBlob" in image) {
    blob = await image.convertToBlob({ type: "image/jpeg", quality });
  } else if ("toBlob" in image) {
    const canvas = image;
    blob = await new Promise((resolve, reject) =>
      canvas.toBlob(
        (b) => (b ? resolve(b) : reject(new TypeError("the canvas could not be encoded (empty?)"))),
        "image/jpeg",
        quality,
      ),
    );
  } else if ("arrayBuffer" in image) {
    blob = image;
  } else {
    throw new TypeError("send() takes a Blob, an ArrayBuffer, a typed array or a canvas");
  }
  return new Uint8Array(await blob.arrayBuffer());
}
