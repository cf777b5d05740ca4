// What the page makes of the protocol's messages (docs/protocol.md) beyond what its client
// (client/, the messages themselves) does: settings compared, events in words.

/** The version this page speaks: its client's (docs/protocol.md, "Versions"). */
export { PROTOCOL_VERSION } from "./client/index.js";

/** Events kept in the page's list, newest first. */
export const EVENTS_SHOWN = 20;

/**
 * One line for an `event` message (protocol 3, docs/events.md): the rule, what happened,
 * the track and what was read, e.g. `lot-in-check · appear · #7 · "LOT 0042"`.
 * @param {{rule: string, on: string, track: number, text: ?string, direction?: string,
 *          dwell_s?: number}} event
 * @returns {string}
 */
export function describeEvent(event) {
  const parts = [event.rule, event.on, `#${event.track}`];
  if (event.direction) parts.push(event.direction);
  if (typeof event.dwell_s === "number") parts.push(`${event.dwell_s.toFixed(1)} s`);
  if (typeof event.text === "string" && event.text) parts.push(JSON.stringify(event.text));
  return parts.join(" · ");
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
