// Every way a session can fail, one class each, named as the Python client names them
// (edge_vision/errors.py, docs/client.md "Exceptions"); a test checks the two lists agree.
//
//   EdgeVisionError
//   └── ProtocolClientError
//       ├── ConnectFailed              no session could be opened (.url)
//       │   ├── ServerUnreachable      no answer: refused, no route, name, TLS, cross-origin
//       │   └── HandshakeRefused       an HTTP status instead of the upgrade (.status, .body)
//       │       ├── WrongPath              no WebSocket at the URL's path (.wsUrl: its /ws)
//       │       ├── AuthenticationFailed   401
//       │       ├── AccessForbidden        403
//       │       ├── ProtocolNotServed      400 unsupported_protocol (.protocols)
//       │       └── ServerUnavailable      503 past the retry budget
//       ├── ConnectionClosed           the socket closed (.code, .reason, .resumable)
//       │   ├── SessionEnded 1000, ServerShuttingDown 1001 after `closing` (.resumeToken),
//       │   ├── IdleTimeout 4003, SlowClient 4002, SessionSuperseded 4000, TokenExpired 4001,
//       │   ├── MessageTooBig 1009 or before sending (.size, .limit), ServerOverloaded 1013,
//       │   └── ServerFailed 1011, ProtocolViolation 1002/1007/1008, ConnectionLost 1006
//       ├── FrameDropped               a later frame was answered first, or the socket closed
//       └── FrameRejected              the server answered the frame with `error` (.code)

/** Base of every error the client raises on purpose. */
export class EdgeVisionError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

export class ProtocolClientError extends EdgeVisionError {}

/** No session could be opened at `url`. */
export class ConnectFailed extends ProtocolClientError {
  /**
   * @param {string} url
   * @param {string} message
   */
  constructor(url, message) {
    super(message);
    this.url = url;
  }
}

/** No answer from the server: refused, no route, a name that does not resolve, TLS. */
export class ServerUnreachable extends ConnectFailed {}

/** The server answered the upgrade with an HTTP status; `body` is its one-line reason. */
export class HandshakeRefused extends ConnectFailed {
  /**
   * @param {string} url
   * @param {number} status
   * @param {string} body
   * @param {string} [message]
   */
  constructor(url, status, body, message) {
    super(url, message ?? `the server at ${url} refused the WebSocket: HTTP ${status}: ${body}`);
    this.status = status;
    this.body = body;
  }
}

/** The URL's path serves no WebSocket (the overlay page, or nothing); `wsUrl` is its /ws. */
export class WrongPath extends HandshakeRefused {
  /**
   * @param {string} url
   * @param {number} status
   * @param {string} message
   * @param {string} wsUrl
   */
  constructor(url, status, message, wsUrl) {
    super(url, status, "", message);
    this.wsUrl = wsUrl;
  }
}

/** HTTP 401: the node needs a token and had none or a bad one. */
export class AuthenticationFailed extends HandshakeRefused {}

/** HTTP 403: the token lacks the `stream` scope, or the page's origin is not allowed. */
export class AccessForbidden extends HandshakeRefused {}

/** HTTP 400 `unsupported_protocol`: `protocols` lists the versions the node serves. */
export class ProtocolNotServed extends HandshakeRefused {
  /**
   * @param {string} url
   * @param {number} status
   * @param {string} body
   * @param {number[]} protocols
   */
  constructor(url, status, body, protocols) {
    super(url, status, body);
    this.protocols = protocols;
  }
}

/** HTTP 503 for longer than the retry budget: warming up, at a limit, or stopping. */
export class ServerUnavailable extends HandshakeRefused {}

/** The session's socket closed (docs/protocol.md, "Close codes"). */
export class ConnectionClosed extends ProtocolClientError {
  /**
   * @param {number|null} code the close code as received (null: none)
   * @param {string} [reason] the close frame's text
   * @param {string} [message]
   */
  constructor(code, reason = "", message) {
    super(message ?? `the server closed the connection (${code}: ${reason || "no reason"})`);
    this.code = code;
    this.reason = reason;
  }

  /** Whether reconnecting with the session's resume token is the right move. */
  get resumable() {
    return false;
  }
}

/** 1000: the session is over (this client or the server closed it normally). */
export class SessionEnded extends ConnectionClosed {}

/** 1001 after a `closing` message: reconnect, to any node, and resume. */
export class ServerShuttingDown extends ConnectionClosed {
  /**
   * @param {number|null} code
   * @param {string} reason
   * @param {string} resumeToken
   */
  constructor(code, reason, resumeToken) {
    super(code, reason);
    this.resumeToken = resumeToken;
  }

  get resumable() {
    return true;
  }
}

/** Nothing came from this client for the server's `server.idle_timeout_s`. */
export class IdleTimeout extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/** This client did not read its results for the server's `server.send_timeout_s`. */
export class SlowClient extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/** A newer connection resumed this session (another tab or device): do not take it back. */
export class SessionSuperseded extends ConnectionClosed {}

/** The credential this connection came with expired: reconnect with a fresh one. */
export class TokenExpired extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/**
 * A message over the node's `server.max_message_bytes` (hello's `limits.max_message_bytes`):
 * thrown by `send()` before anything is sent, with `size` and `limit` (`code` null, the
 * connection stays open); or the server's 1009 close (`size`, `limit` null).
 */
export class MessageTooBig extends ConnectionClosed {
  /**
   * @param {number|null} code
   * @param {string} [reason]
   * @param {{size?: number|null, limit?: number|null}} [sizes]
   */
  constructor(code, reason = "", { size = null, limit = null } = {}) {
    super(
      code,
      reason,
      size !== null && limit !== null
        ? `a frame of ${size} bytes is over this node's limit of ${limit} bytes a message ` +
            "(its server.max_message_bytes, announced in hello); nothing was sent and the " +
            "connection stays open: send a smaller image (scale it down, or lower the quality)"
        : undefined,
    );
    this.size = size;
    this.limit = limit;
  }

  get resumable() {
    return true;
  }
}

/** 1013: the node (or a proxy) is overloaded; reconnect with backoff. */
export class ServerOverloaded extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/** 1011: the server failed in a way that is not this client's fault. */
export class ServerFailed extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/** The server says this client broke the protocol (1002, 1007, or 1008 otherwise). */
export class ProtocolViolation extends ConnectionClosed {}

/** The socket ended without a close frame (1006), or the server stopped answering. */
export class ConnectionLost extends ConnectionClosed {
  get resumable() {
    return true;
  }
}

/** The server answered a later frame first (latest-wins dropped this one), or the
 *  connection closed before this frame's answer; the server counts it as dropped. */
export class FrameDropped extends ProtocolClientError {
  /**
   * @param {number|string} frameId
   * @param {"latest"|"closed"} cause
   */
  constructor(frameId, cause) {
    const why = cause === "latest" ? "a newer frame took its place" : "the connection closed";
    super(`frame ${JSON.stringify(frameId)} was dropped: ${why}`);
    this.frameId = frameId;
    this.dropCause = cause;
  }
}

/** The server answered this frame with an `error` message (`code`: docs/protocol.md). */
export class FrameRejected extends ProtocolClientError {
  /**
   * @param {number|string|null} frameId
   * @param {string} code
   * @param {string} detail the server's message
   */
  constructor(frameId, code, detail) {
    super(`frame ${JSON.stringify(frameId)} was rejected: ${code}: ${detail}`);
    this.frameId = frameId;
    this.code = code;
    this.detail = detail;
  }
}
