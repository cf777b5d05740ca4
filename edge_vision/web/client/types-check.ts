// Checked by tsc (tsconfig.json here; scripts/test runs it), never run or shipped: the
// JavaScript sources conform to index.d.ts, and code a TypeScript user writes against the
// declarations compiles.

import * as declared from "./index.js";
import * as errors from "./errors.js";
import * as wire from "./wire.js";
import {
  EdgeVisionClient,
  FrameDropped,
  MessageTooBig,
  SessionSuperseded,
  WrongPath,
  type ClientState,
  type Detection,
  type Result,
} from "./index.js";

// -- the sources conform to the declarations (client.js says `@implements` for the class)
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : never) : never;
const errorsAgree: Same<keyof typeof errors, Exclude<keyof typeof declared, keyof typeof wire | "EdgeVisionClient">> = true;
const classes: Array<[abstract new (...a: never[]) => unknown, abstract new (...a: never[]) => unknown]> = [
  [errors.WrongPath, declared.WrongPath],
  [errors.ProtocolNotServed, declared.ProtocolNotServed],
  [errors.MessageTooBig, declared.MessageTooBig],
  [errors.ServerShuttingDown, declared.ServerShuttingDown],
  [errors.FrameDropped, declared.FrameDropped],
  [errors.FrameRejected, declared.FrameRejected],
];
const asDeclared: {
  handshake: typeof declared.handshake;
  encodeBinaryFrame: typeof declared.encodeBinaryFrame;
  encodeJsonFrame: typeof declared.encodeJsonFrame;
  classifyClose: typeof declared.classifyClose;
  refusalError: typeof declared.refusalError;
} = wire;
const wrongPathFromSource: declared.WrongPath = new errors.WrongPath("ws://h/", 200, "m", "ws://h/ws");
const closedFromSource: declared.ConnectionClosed = wire.classifyClose(1001, "", "t");

// -- a user's page
async function camera(video: HTMLVideoElement, token: string): Promise<void> {
  const states: ClientState[] = [];
  const client = new EdgeVisionClient("wss://edge-box/ws", {
    token,
    mode: "latest",
    retryMs: Infinity,
    onState: (s) => states.push(s),
    onDrop: (id, cause) => console.log(id, cause === "latest" ? "replaced" : "lost"),
    onEvent: (e) => console.log(e.rule, e.on, e.track),
  });
  const hello = await client.connect();
  const labels: string[] = hello.labels;
  const settings = await client.settings({ confidence: 0.4, read: true });
  const reading: boolean | undefined = settings.read;
  const canvas = document.createElement("canvas");
  canvas.getContext("2d")?.drawImage(video, 0, 0);
  try {
    const sent = await client.send(canvas, { ts: performance.now() });
    const result: Result = await sent.result;
    const first: Detection | undefined = result.detections[0];
    console.log(labels[first?.class ?? 0], first?.box, first?.track, first?.text, reading);
  } catch (e) {
    if (e instanceof FrameDropped) console.log("dropped", e.frameId, e.dropCause);
    else if (e instanceof MessageTooBig) console.log(e.size, e.limit);
    else if (e instanceof SessionSuperseded) console.log("taken over", e.code);
    else if (e instanceof WrongPath) console.log("use", e.wsUrl);
    else throw e;
  }
  for await (const answer of client.results()) {
    if (answer.type === "result") console.log(answer.id, answer.detections.length, answer.receivedAt);
    else console.log(answer.code, answer.message);
  }
  const n: number = client.books.sent - client.books.pending;
  await client.close({ endSession: false });
  console.log(n, states.length, errorsAgree, classes.length, asDeclared, wrongPathFromSource, closedFromSource);
}

export { camera };
