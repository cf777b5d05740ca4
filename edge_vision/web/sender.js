// Frames out: capture the newest picture of the source, JPEG-encode it at the chosen
// quality, send it through the client, and keep at most `maxInFlight` frames unanswered.
// Nothing ever queues: a frame is captured only when a slot is free, so it is always the
// newest one and latency cannot build up however slow the server is.

import { FrameDropped, FrameRejected } from "./client/index.js";
import { sendSize } from "./geometry.js";
import { naturalSize } from "./source.js";

// A frame unanswered this long is written off (lost on the network, or the server dropped
// it in favour of a newer one without our noticing) so its slot is not held forever.
const ANSWER_TIMEOUT_MS = 10000;

/**
 * @typedef {{id: number, ts: number, capturedAt: number, sentAt: number,
 *            width: number, height: number, bytes: number, picture: ImageBitmap}} SentFrame
 */

export class FrameSender {
  /**
   * @param {import("./client/index.js").EdgeVisionClient} client
   * @param {{onSent: (frame: SentFrame) => void, onLost: (n: number) => void,
   *          onResult: (frame: SentFrame, result: import("./client/index.js").Result) => void,
   *          onRejected: (frame: SentFrame, error: FrameRejected) => void}} handlers
   */
  constructor(client, handlers) {
    this.client = client;
    this.handlers = handlers;
    this.options = { quality: 0.8, maxFps: 30, maxSide: 640, wire: "binary", maxInFlight: 1 };
    /** @type {Map<number, SentFrame>} */
    this.pending = new Map();
    this.source = null; // HTMLVideoElement | HTMLImageElement
    this.paused = false;
    this.encoding = false;
    this.lastSentAt = -Infinity;
    this.presentedFrames = 0; // frames the video element has shown (requestVideoFrameCallback)
    this.sentPresented = -1;
    this.timer = null;
    this.expireTimer = null;
    this.canvas = document.createElement("canvas");
    this.ctx = this.canvas.getContext("2d", { alpha: false });
  }

  /** @param {HTMLVideoElement | HTMLImageElement | null} element */
  setSource(element) {
    this.source = element;
    this.presentedFrames = 0;
    this.sentPresented = -1;
    if (element instanceof HTMLVideoElement && "requestVideoFrameCallback" in element) {
      const watch = (_now, meta) => {
        if (this.source !== element) return;
        this.presentedFrames = meta.presentedFrames;
        this.tick();
        element.requestVideoFrameCallback(watch);
      };
      element.requestVideoFrameCallback(watch);
    }
    this.tick();
  }

  /** Frame `frame`'s answer came: its result (the client matched it by id). */
  _answered(frame, result) {
    if (this.pending.get(frame.id) !== frame) return; // written off already
    this.pending.delete(frame.id);
    this.handlers.onResult(frame, result);
    this.tick();
  }

  /**
   * Frame `frame` will not be answered: a later one was (latest-wins replaced it), the
   * connection closed on it (lost), or the server refused it (an `error` message).
   */
  _unanswered(frame, error) {
    if (this.pending.get(frame.id) !== frame) return;
    this.pending.delete(frame.id);
    frame.picture.close();
    if (error instanceof FrameRejected) this.handlers.onRejected(frame, error);
    else if (!(error instanceof FrameDropped && error.dropCause === "latest")) {
      this.handlers.onLost(1); // the connection closed on it
    }
    this.tick();
  }

  /** Send the newest frame if everything allows it now; otherwise come back when it might. */
  tick() {
    clearTimeout(this.timer);
    this.timer = null;
    this._expire();
    if (this.paused || this.encoding || !this.client.isOpen) return;
    if (!this._ready()) {
      // A source still loading has no frame yet; look again shortly.
      if (this.source) this.timer = setTimeout(() => this.tick(), 100);
      return;
    }
    if (this.pending.size >= this.options.maxInFlight) return;
    const now = performance.now();
    const wait = this.lastSentAt + 1000 / this.options.maxFps - now;
    if (wait > 0) {
      this.timer = setTimeout(() => this.tick(), wait);
      return;
    }
    // A video frame already sent is not sent again; the next presented frame calls tick().
    const hasFrameCallback = "requestVideoFrameCallback" in HTMLVideoElement.prototype;
    if (
      this.source instanceof HTMLVideoElement &&
      hasFrameCallback &&
      this.presentedFrames === this.sentPresented
    ) {
      return;
    }
    this._captureAndSend().catch(() => {
      // A source that vanished mid-capture (file switched, camera unplugged): skip the frame
      // and look again shortly.
      this.encoding = false;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.tick(), 200);
    });
  }

  _ready() {
    const s = this.source;
    if (!s) return false;
    const loaded = s instanceof HTMLVideoElement ? s.readyState >= 2 : s.complete;
    return loaded && naturalSize(s).width > 0;
  }

  _expire() {
    const now = performance.now();
    let lost = 0;
    for (const [id, frame] of this.pending) {
      if (now - frame.sentAt > ANSWER_TIMEOUT_MS) {
        this.pending.delete(id);
        frame.picture.close();
        lost += 1;
      }
    }
    if (lost) this.handlers.onLost(lost);
    if (this.pending.size && this.expireTimer === null) {
      this.expireTimer = setTimeout(() => {
        this.expireTimer = null;
        this.tick();
      }, ANSWER_TIMEOUT_MS);
    }
  }

  async _captureAndSend() {
    this.encoding = true;
    const source = this.source;
    const src = naturalSize(source);
    const capturedAt = performance.now();
    const ts = performance.timeOrigin + capturedAt;
    const presented = this.presentedFrames;
    // The picture is kept at full size: the overlay can show exactly this frame under its
    // boxes, and a snapshot is this frame with its boxes.
    const picture = await createImageBitmap(source);
    const { width, height } = sendSize(src.width, src.height, this.options.maxSide);
    if (this.canvas.width !== width || this.canvas.height !== height) {
      this.canvas.width = width;
      this.canvas.height = height;
    }
    this.ctx.drawImage(picture, 0, 0, width, height);
    const jpeg = await new Promise((resolve) =>
      this.canvas.toBlob(resolve, "image/jpeg", this.options.quality),
    );
    if (!jpeg || !this.client.isOpen || this.source !== source || this.paused) {
      picture.close();
      this.encoding = false;
      this.tick();
      return;
    }
    let sent;
    try {
      sent = await this.client.send(jpeg, { ts, wire: this.options.wire });
    } catch (e) {
      // The session ended, or the frame is over the node's size limit (MessageTooBig):
      // the connection's state, or the next smaller frame, says the rest.
      picture.close();
      this.encoding = false;
      this.handlers.onRejected(null, e);
      this.timer = setTimeout(() => this.tick(), 200);
      return;
    }
    const frame = {
      id: sent.id,
      ts,
      capturedAt,
      sentAt: performance.now(),
      width,
      height,
      bytes: jpeg.size,
      picture,
    };
    this.encoding = false;
    this.pending.set(frame.id, frame);
    sent.result.then(
      (result) => this._answered(frame, result),
      (error) => this._unanswered(frame, error),
    );
    this.lastSentAt = frame.sentAt;
    this.sentPresented = presented;
    this.handlers.onSent(frame);
    this.tick();
  }
}
