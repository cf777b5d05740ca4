// What the page makes of the protocol's messages (docs/protocol.md) beyond what its client
// (client/, the messages themselves) does: settings compared.

/** The version this page speaks: its client's (docs/protocol.md, "Versions"). */
export { PROTOCOL_VERSION } from "./client/index.js";

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
