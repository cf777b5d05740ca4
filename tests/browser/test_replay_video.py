"""The video ``edge-vision replay --out`` writes plays in a browser (issue 33): replay a
generated clip as a user types it, ``ffprobe`` names the codec (H.264 in MP4, VP9 in
WebM), and in headless Chromium a ``<video>`` of the file reaches HAVE_CURRENT_DATA, its
``currentTime`` advances while it plays, and a frame it decodes, drawn to a canvas, is the
frame replay annotated (its own boxes, its own number), within the losses of the codec.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_vision.tools.annotate import draw_detections, draw_frame_number

from ..support.browser import PageOpener
from ..support.images import U8Array
from ..support.timing import T
from ..support.video import TextClip, read_video, write_image_folder, write_text_clip

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

FFPROBE = shutil.which("ffprobe")


@dataclass(frozen=True)
class Replayed:
    clip: TextClip
    video: Path
    lines: list[dict[str, Any]]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> TextClip:
    media = tmp_path_factory.mktemp("media")
    return write_text_clip(media / "line.mp4", 640, 360, frames=24, fps=12.0)


def replay(source: Path, frames: int, out: Path, *extra: str) -> list[dict[str, Any]]:
    """``edge-vision replay SOURCE --out OUT --jsonl ...`` as a user runs it; its JSONL."""
    jsonl = out.with_suffix(".jsonl")
    argv = [sys.executable, "-m", "edge_vision", "replay", str(source), "--every-frame"]
    argv += ["--out", str(out), "--jsonl", str(jsonl), "--no-progress", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=T(240))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [ln["status"] for ln in lines] == ["answered"] * frames
    return lines


@pytest.fixture(scope="module", params=[("mp4", "h264"), ("webm", "vp9")], ids=["mp4", "webm"])
def replayed(
    request: pytest.FixtureRequest, clip: TextClip, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Replayed, str]:
    suffix, codec = request.param
    out = tmp_path_factory.mktemp("out") / f"annotated.{suffix}"
    return Replayed(clip, out, replay(clip.path, clip.frames, out)), codec


def annotated(source: U8Array, line: dict[str, Any]) -> U8Array:
    """A source frame (BGR, as replay read it) as replay drew it: its own result and its
    number; RGB."""
    img = source.copy()
    draw_detections(img, line["detections"])
    draw_frame_number(img, line["index"])
    return np.ascontiguousarray(img[:, :, ::-1])


def annotated_frame(run: Replayed, index: int) -> U8Array:
    frames, _ = read_video(run.clip.path)  # decoded as replay reads it
    return annotated(frames[index], run.lines[index])


@pytest.mark.skipif(FFPROBE is None, reason="ffprobe is missing: Debian's ffmpeg package")
def test_ffprobe_names_a_codec_browsers_play(replayed: tuple[Replayed, str]) -> None:
    run, codec = replayed
    probe = subprocess.run(
        [str(FFPROBE), "-v", "error", "-select_streams", "v:0", "-count_frames",
         "-show_entries", "stream=codec_name,pix_fmt,width,height,nb_read_frames",
         "-of", "json", str(run.video)],
        capture_output=True, text=True, timeout=T(60), check=True,
    )  # fmt: skip
    [stream] = json.loads(probe.stdout)["streams"]
    assert stream["codec_name"] == codec
    assert stream["pix_fmt"] == "yuv420p"
    assert (stream["width"], stream["height"]) == (run.clip.width, run.clip.height)
    assert int(stream["nb_read_frames"]) == run.clip.frames


# In the page: the file as a blob URL in a <video>; it plays (muted, so autoplay is allowed),
# then seeks to a frame's time and draws what it shows to a canvas, read back as RGBA.
_PLAY = """async ([b64, mime]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const video = document.createElement('video');
  video.muted = true;
  video.src = URL.createObjectURL(new Blob([bytes], {type: mime}));
  document.body.appendChild(video);
  window.replayVideo = video;
  await video.play();
  return {readyState: video.readyState, error: video.error && video.error.message};
}"""

_FRAME_AT = """async (t) => {
  const video = window.replayVideo;
  video.pause();
  await new Promise((resolve) => {
    video.addEventListener('seeked', resolve, {once: true});
    video.currentTime = t;
  });
  const canvas = document.createElement('canvas');
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  const ctx = canvas.getContext('2d');
  ctx.drawImage(video, 0, 0);
  const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let s = '';
  for (let i = 0; i < px.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, px.subarray(i, i + 0x8000));
  }
  return {width: canvas.width, height: canvas.height, rgba: btoa(s)};
}"""


def frame_in_browser(page: Any, t: float) -> U8Array:
    got = page.evaluate(_FRAME_AT, t)
    rgba = np.frombuffer(base64.b64decode(got["rgba"]), np.uint8)
    return rgba.reshape(got["height"], got["width"], 4)[:, :, :3]


def mean_difference(a: U8Array, b: U8Array) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def around(a: list[float], b: list[float], margin: int = 8) -> tuple[int, int, int, int]:
    """The pixels of two boxes and a margin: where two frames of moving text differ."""
    return (
        max(0, round(min(a[0], b[0])) - margin),
        max(0, round(min(a[1], b[1])) - margin),
        round(max(a[2], b[2])) + margin,
        round(max(a[3], b[3])) + margin,
    )


def quarter(img: U8Array) -> U8Array:
    h, w = img.shape[:2]
    return np.asarray(cv2.resize(img, (w // 4, h // 4), interpolation=cv2.INTER_AREA))


def test_it_plays_in_chromium_and_shows_the_annotated_frames(
    replayed: tuple[Replayed, str], open_page: PageOpener
) -> None:
    run, codec = replayed
    mime = "video/mp4" if codec == "h264" else "video/webm"
    page, watch = open_page("about:blank")
    b64 = base64.b64encode(run.video.read_bytes()).decode()
    started = page.evaluate(_PLAY, [b64, mime])
    assert started["error"] is None, started
    page.wait_for_function("window.replayVideo.readyState >= 2", timeout=T(20) * 1000)
    # It plays: the clock moves (the clip is 2 s long at 12 fps).
    page.wait_for_function("window.replayVideo.currentTime > 0.4", timeout=T(20) * 1000)
    assert page.evaluate("window.replayVideo.videoWidth") == run.clip.width
    fps = run.clip.fps
    for k in (3, 11, 19):
        shown = frame_in_browser(page, (k + 0.5) / fps)
        drawn = annotated_frame(run, k)
        j = k + 4 if k + 4 < run.clip.frames else k - 4
        other = annotated_frame(run, j)
        # The frame replay drew, within the codec's losses (4:2:0 chroma, quantisation) ...
        same = mean_difference(shown, drawn)
        assert same < 4.0, (k, same)
        # ... and not a neighbour: where the text and its box were and went, it is this one.
        x1, y1, x2, y2 = around(
            run.lines[k]["detections"][0]["box"], run.lines[j]["detections"][0]["box"]
        )
        here, there = (
            mean_difference(shown[y1:y2, x1:x2], f[y1:y2, x1:x2]) for f in (drawn, other)
        )
        assert here < there / 3, (k, here, there)
        # Its box is there, in the box's colour (green, class 0), where replay drew it.
        x1, y1, x2, y2 = (round(v) for v in run.lines[k]["detections"][0]["box"])
        edge = shown[y1 - 1 : y1 + 2, x1 + 4 : x2 - 4].reshape(-1, 3).mean(axis=0)
        assert edge[1] > 150 and edge[0] < 110 and edge[2] < 110, (k, edge)
    watch.assert_clean()


def test_odd_sizes_are_padded_to_even_and_still_play(tmp_path: Path, open_page: PageOpener) -> None:
    """4:2:0 needs an even width and height: 321x181 images come out 322x182, the last
    column and row repeated."""
    folder = tmp_path / "shots"
    write_image_folder(folder, width=321, height=181, frames=6)
    out = tmp_path / "odd.mp4"
    lines = replay(folder, 6, out, "--fps", "12")
    page, watch = open_page("about:blank")
    b64 = base64.b64encode(out.read_bytes()).decode()
    assert page.evaluate(_PLAY, [b64, "video/mp4"])["error"] is None
    page.wait_for_function("window.replayVideo.readyState >= 2", timeout=T(20) * 1000)
    shown = frame_in_browser(page, 2.5 / 12)
    assert shown.shape == (182, 322, 3)
    source = cv2.imread(str(folder / "frame_2.png"))
    # These frames are pixel noise (unlike the clip's, smoothed by its own codec): compared
    # where the codec keeps them, at a quarter of their size.
    assert mean_difference(quarter(shown[:181, :321]), quarter(annotated(source, lines[2]))) < 4
    assert mean_difference(shown[:181, 321], shown[:181, 320]) < 6.0
    assert mean_difference(shown[181, :321], shown[180, :321]) < 6.0
    watch.assert_clean()
