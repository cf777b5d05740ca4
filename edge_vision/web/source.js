// Where frames come from: a camera (getUserMedia, Media Capture and Streams §9), a video
// file played in a loop, or a still image. Each shows itself in the stage's <video> or
// <img> element; the sender and the overlay read that element.

import { contentRect } from "./geometry.js";

export const RESOLUTIONS = {
  auto: null,
  "640x480": [640, 480],
  "1280x720": [1280, 720],
  "1920x1080": [1920, 1080],
};

/**
 * The intrinsic size of what a <video> or <img> shows (videoWidth/Height, naturalWidth/Height);
 * 0 × 0 for no element or one not loaded yet.
 * @param {HTMLVideoElement | HTMLImageElement | null} el
 * @returns {{width: number, height: number}}
 */
export function naturalSize(el) {
  if (!el) return { width: 0, height: 0 };
  if (el instanceof HTMLVideoElement) return { width: el.videoWidth, height: el.videoHeight };
  return { width: el.naturalWidth, height: el.naturalHeight };
}

/**
 * Where the picture lies inside its element (object-fit and object-position applied), in CSS
 * pixels from the element's content box; null before the picture has a size.
 * @param {HTMLVideoElement | HTMLImageElement} media
 */
export function pictureRect(media) {
  const nat = naturalSize(media);
  const style = getComputedStyle(media);
  return contentRect(
    media.clientWidth,
    media.clientHeight,
    nat.width,
    nat.height,
    style.objectFit,
    style.objectPosition,
  );
}

export class SourceManager {
  /**
   * @param {HTMLVideoElement} video
   * @param {HTMLImageElement} image
   */
  constructor(video, image) {
    this.video = video;
    this.image = image;
    this.stream = null;
    this.objectUrl = null;
    this.kind = "none"; // "camera" | "video" | "image" | "none"
    // Each open counts up; an open that a later one overtook while it waited (a camera
    // whose permission or start is slow, then a file chosen meanwhile) lets its result go
    // instead of replacing the newer source.
    this.opens = 0;
  }

  /** The element currently showing the source, or null. */
  get element() {
    if (this.kind === "image") return this.image;
    if (this.kind === "camera" || this.kind === "video") return this.video;
    return null;
  }

  get cameraAvailable() {
    return Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);
  }

  /** Cameras the browser lists; labels appear once camera permission is granted. */
  async listCameras() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return [];
    const devices = await navigator.mediaDevices.enumerateDevices();
    return devices
      .filter((d) => d.kind === "videoinput")
      .map((d, i) => ({ deviceId: d.deviceId, label: d.label || `camera ${i + 1}` }));
  }

  /**
   * Start a camera. `deviceId` empty means the browser's choice; `resolution` a key of
   * RESOLUTIONS, asked for as `ideal` so a camera that cannot do it still starts.
   * @returns {Promise<string | null>} the deviceId actually opened; null when a newer
   *   source was opened while this camera started (the camera is stopped again)
   */
  async openCamera(deviceId, resolution) {
    const open = ++this.opens;
    if (!this.cameraAvailable) {
      throw new Error(
        window.isSecureContext
          ? "this browser offers no camera access"
          : "camera access needs HTTPS or localhost; open the page that way, or use a file",
      );
    }
    const video = { facingMode: deviceId ? undefined : { ideal: "environment" } };
    if (deviceId) video.deviceId = { exact: deviceId };
    const size = RESOLUTIONS[resolution];
    if (size) {
      video.width = { ideal: size[0] };
      video.height = { ideal: size[1] };
    }
    // Let go of the old camera first: many phones cannot open a second one alongside it.
    this._release();
    const stream = await navigator.mediaDevices.getUserMedia({ video, audio: false });
    if (open !== this.opens) {
      for (const track of stream.getTracks()) track.stop();
      return null;
    }
    this.stream = stream;
    this._show("camera");
    this.video.loop = false;
    this.video.srcObject = stream;
    await this._play();
    const track = stream.getVideoTracks()[0];
    return (track && track.getSettings().deviceId) || deviceId || "";
  }

  /**
   * A video file (looped) or an image file chosen by the user.
   * @returns {Promise<boolean>} false when a newer source was opened while it loaded
   */
  async openFile(file) {
    const open = ++this.opens;
    const url = URL.createObjectURL(file);
    if (file.type.startsWith("image/")) {
      await new Promise((resolve, reject) => {
        this.image.onload = resolve;
        this.image.onerror = () => reject(new Error(`cannot show ${file.name} as an image`));
        this.image.src = url;
      });
      if (open !== this.opens) {
        URL.revokeObjectURL(url);
        return false;
      }
      this._release();
      this.objectUrl = url;
      this._show("image");
      return true;
    }
    this._release();
    this.objectUrl = url;
    this._show("video");
    this.video.srcObject = null;
    this.video.loop = true;
    this.video.src = url;
    await this._play();
    return true;
  }

  /** Freeze or resume the picture (camera and video; a still image has nothing to pause). */
  setPaused(paused) {
    if (this.kind !== "camera" && this.kind !== "video") return;
    if (paused) this.video.pause();
    else this._play().catch(() => {});
  }

  /** Make `kind` the current source and show the element it plays in, hiding the other. */
  _show(kind) {
    this.kind = kind;
    this.image.hidden = kind !== "image";
    this.video.hidden = kind === "image";
  }

  async _play() {
    this.video.muted = true;
    this.video.playsInline = true;
    try {
      await this.video.play();
    } catch (e) {
      // A newer source replaced this one before it started: not an error.
      if (e.name !== "AbortError") throw e;
    }
  }

  _release() {
    if (this.stream) {
      for (const track of this.stream.getTracks()) track.stop();
      this.stream = null;
    }
    if (this.objectUrl) {
      URL.revokeObjectURL(this.objectUrl);
      this.objectUrl = null;
    }
    this.video.removeAttribute("src");
    this.video.srcObject = null;
    this.kind = "none";
  }
}
