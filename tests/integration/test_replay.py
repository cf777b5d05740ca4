"""``edge-vision replay``: recorded video through the service, as a user runs it.

Every clip is written by the test with OpenCV (mp4v) with known text moving across known
positions (tests/support/video.py), so each frame's right answer is known. The command
runs for real: in-process with the embedded model, against a real server on a loopback
port (JSON and binary frames), behind a real nginx that checks a token, from a real HTTP
MJPEG stream, and as a child process interrupted with SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web

from edge_vision import cli
from edge_vision.common.sources import Cut, FrameCutter, expected_frames
from edge_vision.config import ModelConfig
from edge_vision.model.spec import load_model_spec
from edge_vision.tools import replay
from edge_vision.tools.replay import InOrder, websocket_url

from ..support.assertions import iou
from ..support.cluster import Nginx
from ..support.images import Box, jpeg
from ..support.server import RunningServer, free_port
from ..support.timing import T
from ..support.video import TextClip, read_video, text_frames, write_image_folder, write_text_clip

# The slow engine setting for --realtime: a 640x360 source upscaled to a 1280-wide input
# on one ONNX Runtime thread takes several source frame intervals per frame on this class
# of machine (0.2 to 2 s, varying by day, against 67 ms at 15 fps), so latest-wins must drop.
SLOW_ENGINE = {
    "model": {"input_size": 1280},
    "engine": {"onnxruntime": {"threads": 1}, "warmup_shapes": [[720, 1280]]},
}
SLOW_ENGINE_ARGS = [
    "--set",
    "model.input_size=1280",
    "--set",
    "engine.onnxruntime.threads=1",
    "--set",
    "engine.warmup_shapes=[[720,1280]]",
]


@dataclass
class Run:
    """What one replay left behind."""

    code: int
    lines: list[dict[str, Any]]
    summary: dict[str, Any]
    video: Path | None


def run_replay(tmp: Path, *args: str, name: str = "run", out: bool = False) -> Run:
    """``python -m edge_vision.tools.replay ARGS`` in this process; outputs read back."""
    jsonl, summary = tmp / f"{name}.jsonl", tmp / f"{name}.summary.json"
    video = tmp / f"{name}.mp4" if out else None
    argv = [*args, "--jsonl", str(jsonl), "--summary-json", str(summary), "--no-progress"]
    if video is not None:
        argv += ["--out", str(video)]
    code = replay.main(argv)
    lines = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    return Run(code, lines, orjson.loads(summary.read_bytes()), video)


def boxes(line: dict[str, Any]) -> list[Box]:
    return [tuple(d["box"]) for d in line["detections"]]


def best_iou(line: dict[str, Any], region: Box) -> float:
    return max((iou(b, region) for b in boxes(line)), default=0.0)


def assert_result_belongs_to_its_frame(line: dict[str, Any], clip: TextClip) -> None:
    """The clip frame whose text best matches this result's box is the frame itself (±1):
    a result never describes a neighbour's picture."""
    ious = [best_iou(line, b) for b in clip.boxes]
    best = int(np.argmax(ious))
    assert abs(best - line["index"]) <= 1, (
        f"result of frame {line['index']} matches frame {best} best: {line['detections']}"
    )


def edge_change(after: np.ndarray, before: np.ndarray, box: Box) -> float:
    """Mean pixel change along a box's outline: large where replay drew that box."""
    x1, y1, x2, y2 = (round(v) for v in box)
    h, w = before.shape[:2]
    x1, x2 = max(0, x1), min(w - 1, x2)
    y1, y2 = max(0, y1), min(h - 1, y2)
    diff = np.abs(after.astype(np.int16) - before.astype(np.int16)).sum(axis=2)
    outline = np.concatenate([diff[y1, x1:x2], diff[y2, x1:x2], diff[y1:y2, x1], diff[y1:y2, x2]])
    return float(outline.mean())


def is_marked_no_result(img: np.ndarray) -> bool:
    """The red border replay draws on frames without a result."""
    border = np.concatenate([img[1, :], img[-2, :], img[:, 1], img[:, -2]]).astype(int)
    b, g, r = border.mean(axis=0)
    return bool(r > 180 and g < 90 and b < 90)


# -- clips shared by the tests of this module ----------------------------------------------


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replay-media")


@pytest.fixture(scope="module")
def clip(media: Path) -> TextClip:
    return write_text_clip(media / "line.mp4", 640, 360, frames=48, fps=30.0)


@pytest.fixture(scope="module")
def realtime_clip(media: Path) -> TextClip:
    """Long enough (4.8 s) for the slow engine to answer several frames even on a slow day
    (0.2 to 2 s a frame on these machines), at 15 fps so that the text still moves about
    5 px a frame and each result can be matched to its own frame."""
    return write_text_clip(media / "realtime.mp4", 640, 360, frames=72, fps=15.0)


@pytest.fixture(scope="module")
def in_process(clip: TextClip, media: Path) -> Run:
    """The reference: every frame in-process, with an annotated video."""
    return run_replay(media, str(clip.path), "--every-frame", name="in-process", out=True)


# -- in-process, every frame -----------------------------------------------------------------


def test_every_frame_in_process_answers_each_frame_where_the_text_is(
    in_process: Run, clip: TextClip
) -> None:
    assert in_process.code == 0
    lines = in_process.lines
    assert [ln["index"] for ln in lines] == list(range(clip.frames))
    assert all(ln["status"] == "answered" for ln in lines)
    assert [ln["ts"] for ln in lines] == pytest.approx([clip.ts(i) for i in range(clip.frames)])
    found = [best_iou(ln, clip.boxes[ln["index"]]) >= 0.5 for ln in lines]
    assert sum(found) >= 0.9 * clip.frames, f"text found on {sum(found)}/{clip.frames} frames"
    for ln in lines:
        assert (ln["width"], ln["height"]) == (clip.width, clip.height)
        assert (
            ln["timing"]["infer_ms"] > 0 and ln["timing"]["latency_ms"] >= ln["timing"]["infer_ms"]
        )
        assert ln["dropped"] == 0
    s = in_process.summary
    assert (s["frames"], s["answered"], s["dropped"], s["error"]) == (
        clip.frames,
        clip.frames,
        0,
        0,
    )
    assert s["mode"] == "every" and s["target"] == "in-process onnxruntime"
    assert s["fps"] > 0
    for stage in ("encode_ms", "decode_ms", "queue_ms", "infer_ms", "post_ms", "latency_ms"):
        p = s["latency_ms"][stage]
        assert 0 <= p["p50"] <= p["p95"] <= p["p99"] <= p["max"], (stage, p)


def test_annotated_video_has_every_frame_with_its_own_boxes(
    in_process: Run, clip: TextClip
) -> None:
    assert in_process.video is not None
    out, fps = read_video(in_process.video)
    src, _ = read_video(clip.path)
    assert len(out) == clip.frames and fps == pytest.approx(clip.fps)
    assert out[0].shape == (clip.height, clip.width, 3)
    for k in range(0, clip.frames - 20, 7):
        drawn = in_process.lines[k]["detections"][0]["box"]
        later = in_process.lines[k + 20]["detections"][0]["box"]  # another frame's result
        assert edge_change(out[k], src[k], drawn) > 60, f"frame {k}: its box is not drawn"
        assert edge_change(out[k], src[k], later) < 30, f"frame {k}: frame {k + 20}'s box drawn"
        assert not is_marked_no_result(out[k])


def test_cut_and_progress_through_edge_vision_replay_on_a_720p_clip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = write_text_clip(tmp_path / "hd.mp4", 1280, 720, frames=30, fps=30.0)
    jsonl, video = tmp_path / "cut.jsonl", tmp_path / "cut.mp4"
    code = cli.main(
        ["replay", str(clip.path), "--start", "0.5", "--duration", "0.5", "--fps", "15",
         "--jsonl", str(jsonl), "--out", str(video), "--progress"]
    )  # fmt: skip
    assert code == 0
    lines = [orjson.loads(x) for x in jsonl.read_bytes().splitlines()]
    assert [ln["index"] for ln in lines] == [15, 17, 19, 21, 23, 25, 27, 29]
    assert [ln["ts"] for ln in lines] == pytest.approx([clip.ts(i) for i in range(15, 30, 2)])
    for ln in lines:
        assert best_iou(ln, clip.boxes[ln["index"]]) >= 0.5, ln
    frames, fps = read_video(video)
    assert len(frames) == 8 and frames[0].shape == (720, 1280, 3) and fps == pytest.approx(15)
    captured = capsys.readouterr()
    assert "8/8" in captured.err and "frame/s" in captured.err  # the progress bar, with rate
    assert "frames 8  answered 8  dropped 0" in captured.out  # the summary


def test_a_folder_of_images_replays_in_name_order(tmp_path: Path) -> None:
    boxes_ = write_image_folder(tmp_path / "shots", frames=11)  # frame_10 after frame_9
    run = run_replay(tmp_path, str(tmp_path / "shots"), "--fps", "5")
    assert [ln["index"] for ln in run.lines] == list(range(11))
    assert [ln["ts"] for ln in run.lines] == [i * 200.0 for i in range(11)]
    for ln in run.lines:
        assert best_iou(ln, boxes_[ln["index"]]) >= 0.5, ln


# -- against a running server ---------------------------------------------------------------


@pytest.mark.parametrize("wire", ["json", "binary"])
async def test_a_running_server_gives_the_in_process_answers(
    server: RunningServer, in_process: Run, clip: TextClip, tmp_path: Path, wire: str
) -> None:
    run = await asyncio.to_thread(
        run_replay, tmp_path, str(clip.path), "--url", server.ws_url, "--wire", wire
    )
    assert run.code == 0
    assert [ln["index"] for ln in run.lines] == list(range(clip.frames))
    for remote, local in zip(run.lines, in_process.lines, strict=True):
        assert remote["status"] == "answered"
        assert remote["ts"] == local["ts"] == pytest.approx(clip.ts(remote["index"]))  # echoed
        assert len(remote["detections"]) == len(local["detections"]), (remote, local)
        for a, b in zip(boxes(remote), boxes(local), strict=True):
            assert max(abs(p - q) for p, q in zip(a, b, strict=True)) <= 3, (a, b)
    s = run.summary
    assert s["answered"] == clip.frames and s["dropped"] == 0
    assert s["duplicates"] == 0 and s["ts_mismatches"] == 0 and s["wire"] == wire
    assert s["target"].startswith(server.ws_url)


# -- real time: latest wins against a deliberately slow engine --------------------------------


def check_realtime_run(run: Run, clip: TextClip) -> None:
    lines = run.lines
    # every frame exactly once, in order; none answered twice
    assert [ln["index"] for ln in lines] == list(range(clip.frames))
    statuses = [ln["status"] for ln in lines]
    assert set(statuses) <= {"answered", "dropped"}
    answered = [ln for ln in lines if ln["status"] == "answered"]
    assert run.summary["dropped"] == statuses.count("dropped") > clip.frames // 2
    assert len(answered) >= 2 and lines[-1]["status"] == "answered"  # the last is always served
    assert [ln["dropped"] for ln in lines][-1] == run.summary["dropped"]
    for ln in answered:
        assert_result_belongs_to_its_frame(ln, clip)
    # Current: the engine always takes the newest frame. A frame that a newer one could still
    # replace was the newest when the engine freed up, so it waited at most about one source
    # interval and its latency is one frame's processing (a stale pick shows as about 2x).
    # Only the last frame can also wait for the whole frame in the engine.
    one_frame_ms = max(ln["timing"]["server_ms"] - ln["timing"]["queue_ms"] for ln in answered)
    *earlier, last = answered
    for ln in earlier:
        assert ln["timing"]["latency_ms"] <= 1.5 * one_frame_ms, (ln, one_frame_ms)
    assert last["timing"]["latency_ms"] <= 2 * one_frame_ms + T(1) * 300, (last, one_frame_ms)


def test_realtime_in_process_drops_and_stays_current_on_a_slow_engine(
    realtime_clip: TextClip, tmp_path: Path
) -> None:
    clip = realtime_clip
    run = run_replay(tmp_path, str(clip.path), "--realtime", *SLOW_ENGINE_ARGS, out=True)
    assert run.code == 0 and run.summary["mode"] == "latest"
    check_realtime_run(run, clip)
    assert run.video is not None
    video, _ = read_video(run.video)
    assert len(video) == clip.frames
    for ln, img in zip(run.lines, video, strict=True):
        assert is_marked_no_result(img) == (ln["status"] == "dropped"), ln["index"]


async def test_realtime_against_a_slow_server_counts_the_servers_drops(
    server_factory: Any, realtime_clip: TextClip, tmp_path: Path
) -> None:
    clip = realtime_clip
    slow_spec = await asyncio.to_thread(load_model_spec, ModelConfig(input_size=1280))
    srv = await server_factory(SLOW_ENGINE, slow_spec)
    run = await asyncio.to_thread(
        run_replay, tmp_path, str(clip.path), "--realtime", "--url", srv.ws_url
    )
    assert run.code == 0
    check_realtime_run(run, clip)
    s = run.summary
    assert s["duplicates"] == 0 and s["ts_mismatches"] == 0
    assert s["server_dropped"] == s["dropped"]  # what the server counted is what we saw


# -- a live HTTP camera (MJPEG) --------------------------------------------------------------


@pytest.fixture
async def mjpeg_camera() -> AsyncIterator[tuple[str, list[Box]]]:
    """A real HTTP MJPEG camera stream (multipart/x-mixed-replace) at 30 fps, 30 frames."""
    images, text_boxes = text_frames(480, 270, 30)
    payloads = [jpeg(img[:, :, ::-1]) for img in images]  # the camera's JPEGs (RGB in)

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "multipart/x-mixed-replace; boundary=frame"}
        )
        await resp.prepare(request)
        for data in payloads:
            head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(data)}\r\n\r\n"
            await resp.write(head.encode() + data + b"\r\n")
            await asyncio.sleep(1 / 30)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/cam.mjpg", stream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/cam.mjpg", text_boxes
    finally:
        await runner.cleanup()


async def test_a_live_http_camera_is_replayed_in_real_time(
    mjpeg_camera: tuple[str, list[Box]], tmp_path: Path
) -> None:
    url, text_boxes = mjpeg_camera
    started_ms = time.time() * 1000
    run = await asyncio.to_thread(run_replay, tmp_path, url)
    assert run.code == 0
    s = run.summary
    assert s["source"]["live"] and s["mode"] == "latest"  # a camera paces itself
    assert [ln["index"] for ln in run.lines] == list(range(len(text_boxes)))
    ts = [ln["ts"] for ln in run.lines]
    assert started_ms <= ts[0] and ts == sorted(ts) and ts[-1] <= time.time() * 1000
    assert run.lines[-1]["status"] == "answered"
    for ln in run.lines:
        if ln["status"] == "answered":
            assert best_iou(ln, text_boxes[ln["index"]]) >= 0.5, ln


# -- Ctrl-C -----------------------------------------------------------------------------------


def test_ctrl_c_leaves_a_valid_video_jsonl_and_summary(tmp_path: Path) -> None:
    clip = write_text_clip(tmp_path / "long.mp4", 320, 180, frames=300, fps=30.0)
    jsonl, video, summary = tmp_path / "i.jsonl", tmp_path / "i.mp4", tmp_path / "i.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_vision.replay", str(clip.path), "--every-frame",
         "--in-flight", "1", "--out", str(video), "--jsonl", str(jsonl),
         "--summary-json", str(summary)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + T(60)
        while time.monotonic() < deadline and proc.poll() is None:
            if jsonl.exists() and jsonl.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"replay ended before the interrupt ({proc.returncode}): {err[-2000:]}")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=T(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # reaps it and closes the pipes
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = [orjson.loads(x) for x in jsonl.read_bytes().splitlines()]  # every line parses
    assert 5 <= len(lines) < clip.frames
    assert [ln["index"] for ln in lines] == list(range(len(lines)))
    assert all(ln["status"] == "answered" for ln in lines)  # frames in flight were finished
    frames, _ = read_video(video)
    assert len(frames) == len(lines) and frames[0].shape == (180, 320, 3)
    s = orjson.loads(summary.read_bytes())
    assert s["interrupted"] and s["frames"] == s["answered"] == len(lines)
    assert "interrupted" in stdout and f"frames {len(lines)}" in stdout


# -- clear errors -----------------------------------------------------------------------------


def replay_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = replay.main([*args, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def test_a_missing_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = replay_error(capsys, str(tmp_path / "nope.mp4"))
    assert "nope.mp4" in err and "no such file" in err


@pytest.mark.parametrize(
    ("out", "flags", "said"),
    [
        (
            "a.avi",
            [],
            "--out {out}: replay writes video browsers play: .mp4 (H.264) or .webm (VP9), "
            "also .m4v, .mov, .mkv; not .avi",
        ),
        ("a.mp4", ["--codec", "mpeg4"], "--codec mpeg4: unknown; use h264 (.mp4) or vp9 (.webm)"),
        ("a.mp4", ["--codec", "vp9"], "--codec vp9 does not go in .mp4 files; use .webm or .mkv"),
        (
            "a.mp4",
            ["--fourcc", "mp4v"],
            "--fourcc mp4v: replay writes only video browsers play; use --codec h264 (.mp4) "
            "or --codec vp9 (.webm)",
        ),
    ],
)
def test_an_output_video_browsers_cannot_play_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    clip: TextClip,
    out: str,
    flags: list[str],
    said: str,
) -> None:
    path = tmp_path / out
    err = replay_error(capsys, str(clip.path), "--out", str(path), *flags)
    assert err.splitlines() == ["edge-vision replay: " + said.format(out=path)]
    assert not path.exists()  # refused before the model loads, nothing written


def test_an_unknown_codec_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An AVI whose FourCC names a codec no decoder knows.
    write_text_clip(tmp_path / "ok.avi", 160, 90, frames=3, fourcc="MJPG")
    data = (tmp_path / "ok.avi").read_bytes().replace(b"MJPG", b"QQQQ")
    (tmp_path / "odd.avi").write_bytes(data)
    err = replay_error(capsys, str(tmp_path / "odd.avi"))
    assert "odd.avi" in err and "codec" in err


def test_undecodable_frames_are_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A sound AVI container whose JPEG frames are zeroed: it opens, nothing decodes.
    write_text_clip(tmp_path / "ok.avi", 160, 90, frames=3, fourcc="MJPG")
    data = bytearray((tmp_path / "ok.avi").read_bytes())
    start = data.find(b"\xff\xd8\xff")
    while start >= 0:
        end = data.find(b"\xff\xd9", start) + 2
        data[start:end] = bytes(end - start)
        start = data.find(b"\xff\xd8\xff", end)
    (tmp_path / "zeroed.avi").write_bytes(bytes(data))
    err = replay_error(capsys, str(tmp_path / "zeroed.avi"))
    assert "zeroed.avi" in err and "no frame could be decoded" in err


def test_a_missing_camera_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    index = next(i for i in range(9, 64) if not Path(f"/dev/video{i}").exists())
    err = replay_error(capsys, str(index))
    assert f"camera {index} cannot be opened" in err


def test_an_unreachable_server_is_reported(
    capsys: pytest.CaptureFixture[str], clip: TextClip
) -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"
    started = time.monotonic()
    # A refused connection is retried for --timeout (a server may be starting), then named.
    err = replay_error(capsys, str(clip.path), "--url", url, "--timeout", "1")
    assert "cannot reach the server" in err and "refused" in err.lower()
    assert time.monotonic() - started < T(20)


# -- a token checked by the proxy in front (nginx) ---------------------------------------------


@pytest.fixture
def token_proxy(server: RunningServer, tmp_path: Path) -> Iterator[Nginx]:
    """Real nginx in front of a server, refusing /ws without ``Authorization: Bearer``."""
    proxy = Nginx(tmp_path / "nginx", [server.port], ws_token="s3cret")
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


async def test_a_token_is_sent_and_a_refusal_is_reported(
    token_proxy: Nginx, clip: TextClip, tmp_path: Path
) -> None:
    ok = await asyncio.to_thread(
        run_replay, tmp_path, str(clip.path), "--url", token_proxy.ws_url, "--token", "s3cret",
        "--duration", "0.2",
    )  # fmt: skip
    assert ok.code == 0 and ok.summary["answered"] == ok.summary["frames"] == 6

    def refused(*args: str) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "edge_vision.tools.replay", str(clip.path), "--url",
             token_proxy.ws_url, *args],
            capture_output=True, text=True, timeout=T(60),
        )  # fmt: skip
        return proc.returncode, proc.stderr

    for args, hint in ((["--token", "wrong"], "check --token"), ([], "it needs --token")):
        code, err = await asyncio.to_thread(refused, *args)
        assert code == 2 and "refused authorisation (HTTP 401)" in err and hint in err, err


# -- the pure parts ---------------------------------------------------------------------------


def test_in_order_releases_frames_without_gaps() -> None:
    order: InOrder[str] = InOrder()
    assert order.add(1, "b") == []
    assert order.add(0, "a") == [(0, "a"), (1, "b")]
    assert order.add(3, "d") == [] and order.held == 1
    assert order.add(2, "c") == [(2, "c"), (3, "d")]
    with pytest.raises(RuntimeError):
        order.add(2, "again")


def test_cutting_keeps_the_frames_asked_for() -> None:
    def kept(cut: Cut, n: int = 60, fps: float = 30.0) -> list[int]:
        cutter = FrameCutter(cut, fps)
        out = []
        for i in range(n):
            verdict = cutter.verdict(i * 1000.0 / fps)
            if verdict == "stop":
                break
            if verdict == "keep":
                out.append(i)
        return out

    assert kept(Cut(fps=10)) == list(range(0, 60, 3))
    assert kept(Cut(start_s=1.0, duration_s=0.5)) == list(range(30, 45))
    assert kept(Cut(fps=60)) == list(range(60))  # above the source rate: every frame
    for cut in (Cut(fps=10), Cut(start_s=1.0, duration_s=0.5), Cut(start_s=0.5, fps=7)):
        assert expected_frames(60, 30.0, cut) == len(kept(cut)), cut


def test_server_urls_are_completed() -> None:
    assert websocket_url("ws://h:8080", "every") == "ws://h:8080/ws?mode=every"
    assert websocket_url("https://h/ws", "latest") == "wss://h/ws?mode=latest"
    assert websocket_url("ws://h/ws?mode=every", "latest") == "ws://h/ws?mode=every"
    with pytest.raises(replay.ReplayError):
        websocket_url("ftp://h", "every")
