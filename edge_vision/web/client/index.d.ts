// Types of the edge_vision JavaScript client (docs/js-client.md). The messages keep the
// field names of the wire (docs/protocol.md), so the protocol's page describes them too.
/// <reference lib="dom" />

/** A frame's id: chosen by the client (default 0, 1, 2, …), echoed by the server. */
export type FrameId = number | string;
/** Admission: `latest` (real time: the newest frame wins) or `every` (in order, none lost). */
export type Mode = "latest" | "every";
/** How a frame travels: raw bytes after a small JSON header, or base64 inside JSON. */
export type Wire = "binary" | "json";
/** Why a frame went unanswered: a later frame was answered first, or the socket closed. */
export type DropCause = "latest" | "closed";
/** What `send()` takes: JPEG or PNG bytes, or a canvas (encoded to JPEG at `quality`). */
export type FrameImage = Blob | ArrayBuffer | ArrayBufferView | HTMLCanvasElement | OffscreenCanvas;

/** A session's effective settings (`settings` answer; hello's `settings`). */
export interface Settings {
  mode: Mode;
  confidence: number;
  classes: number[] | null;
  /** Since protocol 2 (feature `track`). */
  track?: boolean;
  /** Since protocol 2 (feature `input_size`); null: the node's `limits.input_size`. */
  input_size?: number | null;
  /** Since protocol 2 (feature `read`). */
  read?: boolean;
  /** Since protocol 3 (feature `events`): the session's own zones, lines and rules. */
  zones?: Record<string, number[][]> | null;
  lines?: Record<string, number[][]> | null;
  rules?: Array<Record<string, unknown>> | null;
  [field: string]: unknown;
}

/** What a `settings()` call may change; only the fields given are sent. */
export interface SettingsChange {
  mode?: Mode;
  confidence?: number;
  classes?: number[] | null;
  track?: boolean;
  input_size?: number | null;
  read?: boolean;
  zones?: Record<string, number[][]> | null;
  lines?: Record<string, number[][]> | null;
  rules?: Array<Record<string, unknown>> | null;
  [field: string]: unknown;
}

/** What the node accepts (hello's `limits`). */
export interface Limits {
  max_message_bytes: number;
  max_pixels: number;
  input_size: number;
  input_sizes?: number[];
  max_decoded_bytes?: number;
  max_batch: number;
  formats: string[];
  binary_frames: boolean;
  max_messages_per_s?: number;
  message_burst?: number;
  [field: string]: unknown;
}

/** The server's first message on every connection (a resume brings a new one). */
export interface Hello {
  type: "hello";
  protocol: number;
  protocols: number[];
  features: string[];
  session_id: string;
  resume_token: string;
  resumed: boolean;
  node: string;
  model: string;
  labels: string[];
  engine: Record<string, unknown>;
  mode: Mode;
  settings: Settings;
  limits: Limits;
  counters: { received: number; answered: number; dropped: number; rejected: number };
  /** Since protocol 3 (optional): the node's own zones and lines, and its anchor. */
  events?: {
    zones: Record<string, number[][]>;
    lines: Record<string, number[][]>;
    anchor: "bottom_center" | "center";
  };
  [field: string]: unknown;
}

/** One box in the frame's own pixels (x right, y down). */
export interface Detection {
  box: [number, number, number, number];
  score: number;
  class: number;
  label: string;
  /** Since protocol 2, while the session's `track` setting is on. */
  track?: number;
  /** Since protocol 2, with `read` on: the text read (null: not read yet). */
  text?: string | null;
  text_score?: number | null;
  /** Since protocol 3, while the session has zones. */
  zones?: string[];
}

/** The answer to one frame. */
export interface Result {
  type: "result";
  id: FrameId;
  ts: number | null;
  width: number;
  height: number;
  detections: Detection[];
  timing: Record<string, number>;
  /** Frames this session has dropped so far (the server's count). */
  dropped: number;
  /** `performance.now()` (or `Date.now()` where there is none) when it arrived. */
  receivedAt: number;
}

/** An `error` message; `id` null when the server could not tie it to a frame. */
export interface FrameError {
  type: "error";
  id: FrameId | null;
  code: string;
  message: string;
}

export type Answer = Result | FrameError;

/** Since protocol 3: an event one of the session's rules raised (docs/events.md). */
export interface EdgeEvent {
  type: "event";
  event_id: string;
  rule: string;
  on: string;
  node: string;
  session: string;
  frame_id: FrameId | null;
  ts: number | null;
  at: number;
  track: number;
  class: number;
  label: string;
  score: number;
  box: [number, number, number, number];
  text: string | null;
  zone: string | null;
  zones: string[];
  [field: string]: unknown;
}

/** A frame on its way: its id and ts as sent, its message's size, and its answer. */
export interface SentFrame {
  id: FrameId;
  ts: number | null;
  bytes: number;
  /** Resolves with the frame's Result; rejects with FrameDropped, FrameRejected, or the
   *  ConnectionClosed that ended the session. */
  result: Promise<Result>;
}

/** What became of the frames sent, across resumes:
 *  sent = answered + dropped + rejected + lost + pending. */
export interface Books {
  sent: number;
  answered: number;
  /** A later frame was answered first (latest-wins; the server counts them so too). */
  dropped: number;
  rejected: number;
  /** In flight when a connection closed. */
  lost: number;
  /** Results for no frame waiting. */
  unmatched: number;
  readonly pending: number;
}

/** Where the connection stands; `onState` hears of every change. */
export type ClientState =
  | { kind: "idle" }
  | { kind: "connecting"; attempt: number; resuming: boolean }
  | { kind: "open"; hello: Hello; resumed: boolean; resuming: boolean }
  | { kind: "waiting"; attempt: number; retryAt: number; error: ProtocolClientError }
  | { kind: "closed"; error: ProtocolClientError };

export interface ClientOptions {
  /** An access token or API key (sent as a subprotocol entry), or a function giving a
   *  fresh one at each connect (then an expired token is renewed by a resume). */
  token?: string | null | (() => string | null | Promise<string | null>);
  /** The version to speak (1, 2 or 3). Not given: 3, or the newest the node serves. */
  protocol?: number;
  mode?: Mode;
  /** Reconnect and resume after a resumable close (default true). */
  resume?: boolean;
  /** Resume this session (from an earlier hello) instead of starting one. */
  resumeToken?: string | null;
  /** How long connecting and resuming retry (ms; default 30 000; Infinity: for ever). */
  retryMs?: number;
  /** The first wait between attempts (ms, default 250), doubling up to `backoffMaxMs`. */
  backoffFirstMs?: number;
  /** The longest wait between attempts (ms, default 5 000). */
  backoffMaxMs?: number;
  /** An attempt that brings no hello within this is given up and retried (ms, 10 000). */
  openTimeoutMs?: number;
  /** Default frame form: `binary` where the node has it, else `json`. */
  wire?: Wire;
  /** JPEG quality for canvases (0 to 1, default 0.85). */
  quality?: number;
  /** How long `settings()` and `ping()` wait for their answer (ms, default 30 000). */
  replyTimeoutMs?: number;
  /** An application ping this often while open (ms, default 5 000; 0: none). */
  pingIntervalMs?: number;
  /** No message for this long: the connection is taken as lost (ms, default 15 000). */
  silenceLimitMs?: number;
  /** Answers and events kept for `results()` / `events()` until taken (default 1024). */
  resultsBuffer?: number;
  onHello?: (hello: Hello) => void;
  onState?: (state: ClientState) => void;
  onDrop?: (id: FrameId, cause: DropCause) => void;
  onEvent?: (event: EdgeEvent) => void;
  /** The WebSocket class (default `globalThis.WebSocket`; in Node < 22, e.g. `ws`'s). */
  WebSocket?: typeof WebSocket;
  /** `fetch`, for asking why an upgrade was refused (default `globalThis.fetch`). */
  fetch?: typeof fetch;
}

export interface SendOptions {
  /** Default 0, 1, 2, …; an id still waiting for its answer is refused. */
  id?: FrameId;
  /** The capture time (any unit, echoed); default `Date.now()`; null sends `null`. */
  ts?: number | null;
  wire?: Wire;
  quality?: number;
}

/** One camera session with an edge_vision node (or a balancer in front of several). */
export class EdgeVisionClient {
  constructor(url: string, options?: ClientOptions);
  readonly url: string;
  /** The hello of the current connection; null before the first one. */
  readonly hello: Hello | null;
  readonly state: ClientState;
  /** Whether frames can be sent right now (open, hello received). */
  readonly isOpen: boolean;
  readonly books: Books;
  /** Frames sent whose answer has not come yet. */
  readonly pending: number;
  /** How often the session was resumed after a close. */
  readonly resumes: number;
  /** How often a refused or failed attempt was retried. */
  readonly retries: number;
  /** Open the session; retries 503 and unreachable servers for `retryMs`. */
  connect(): Promise<Hello>;
  /** Send one frame; resolves once it is sent (during a resume: once resumed). Throws
   *  MessageTooBig before sending a message over the node's limit. */
  send(image: FrameImage, options?: SendOptions): Promise<SentFrame>;
  /** Send one frame and wait for its result. */
  detect(image: FrameImage, options?: SendOptions): Promise<Result>;
  /** Change settings (only those given); resolves with the effective settings, rejects
   *  with FrameRejected (`bad_settings`). */
  settings(change: SettingsChange): Promise<Settings>;
  /** An application ping; resolves with the pong's payload. */
  ping(payload?: unknown): Promise<unknown>;
  /** Every answer in arrival order, across resumes; ends after close(), throws the close
   *  reason when the session ended otherwise. */
  results(): AsyncGenerator<Answer, void, undefined>;
  /** Every event (protocol 3) in arrival order, across resumes; ends like results(). */
  events(): AsyncGenerator<EdgeEvent, void, undefined>;
  /** Drop the connection and connect again now, skipping any wait (resuming the session
   *  unless close() ended it); also after the client failed or was closed. */
  reconnect(): void;
  /** Close: with `endSession` (default) 1000, and the session ends; otherwise 4000, and it
   *  stays resumable with its token. */
  close(options?: { endSession?: boolean }): Promise<void>;
}

export const PROTOCOL_VERSION: number;
export const PROTOCOLS: readonly number[];
export const SUBPROTOCOL: string;

/** The handshake's URL and subprotocol entries (docs/protocol.md, "Connecting"). */
export function handshake(
  url: string,
  options: { protocol: number; mode?: string | null; token?: string | null; resumeToken?: string | null },
): { url: string; protocols: string[] };
export function encodeBinaryFrame(id: FrameId, ts: number | null, image: Uint8Array): Uint8Array;
export function encodeJsonFrame(id: FrameId, ts: number | null, image: Uint8Array): string;
export function classifyClose(
  code: number | null,
  reason: string,
  closingToken: string | null,
): ConnectionClosed;
export function refusalError(url: string, status: number, body: string): HandshakeRefused;

export class EdgeVisionError extends Error {}
export class ProtocolClientError extends EdgeVisionError {}
export class ConnectFailed extends ProtocolClientError {
  constructor(url: string, message: string);
  url: string;
}
export class ServerUnreachable extends ConnectFailed {}
export class HandshakeRefused extends ConnectFailed {
  constructor(url: string, status: number, body: string, message?: string);
  status: number;
  /** The server's one-line reason. */
  body: string;
}
export class WrongPath extends HandshakeRefused {
  constructor(url: string, status: number, message: string, wsUrl: string);
  /** Where the node serves its WebSocket (the same address, path /ws). */
  wsUrl: string;
}
export class AuthenticationFailed extends HandshakeRefused {}
export class AccessForbidden extends HandshakeRefused {}
export class ProtocolNotServed extends HandshakeRefused {
  constructor(url: string, status: number, body: string, protocols: number[]);
  protocols: number[];
}
export class ServerUnavailable extends HandshakeRefused {}
export class ConnectionClosed extends ProtocolClientError {
  constructor(code: number | null, reason?: string, message?: string);
  /** The close code as received; null when refused before sending (MessageTooBig). */
  code: number | null;
  /** The close frame's text. */
  reason: string;
  /** Whether reconnecting with the session's resume token is the right move. */
  readonly resumable: boolean;
}
export class SessionEnded extends ConnectionClosed {}
export class ServerShuttingDown extends ConnectionClosed {
  constructor(code: number | null, reason: string, resumeToken: string);
  resumeToken: string;
}
export class IdleTimeout extends ConnectionClosed {}
export class SlowClient extends ConnectionClosed {}
export class SessionSuperseded extends ConnectionClosed {}
export class TokenExpired extends ConnectionClosed {}
export class MessageTooBig extends ConnectionClosed {
  constructor(code: number | null, reason?: string, sizes?: { size?: number | null; limit?: number | null });
  /** The message's size and the node's limit, in bytes (null for a 1009 close). */
  size: number | null;
  limit: number | null;
}
export class ServerOverloaded extends ConnectionClosed {}
export class ServerFailed extends ConnectionClosed {}
export class ProtocolViolation extends ConnectionClosed {}
export class ConnectionLost extends ConnectionClosed {}
export class FrameDropped extends ProtocolClientError {
  constructor(frameId: FrameId, cause: DropCause);
  frameId: FrameId;
  dropCause: DropCause;
}
export class FrameRejected extends ProtocolClientError {
  constructor(frameId: FrameId | null, code: string, detail: string);
  frameId: FrameId | null;
  /** The error code (docs/protocol.md, "error"). */
  code: string;
  /** The server's message. */
  detail: string;
}
