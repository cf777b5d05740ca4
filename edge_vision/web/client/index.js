// The edge_vision JavaScript client (docs/js-client.md): an ES module for browsers (and
// Node with a WebSocket), typed by index.d.ts. The overlay page is built on it.

export { EdgeVisionClient } from "./client.js";
export * from "./errors.js";
export {
  PROTOCOLS,
  PROTOCOL_VERSION,
  SUBPROTOCOL,
  classifyClose,
  encodeBinaryFrame,
  encodeJsonFrame,
  handshake,
  refusalError,
} from "./wire.js";
