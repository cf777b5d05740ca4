"""The overlay page (edge_vision/web/) in headless Chromium, served by the real service with
the default model, fed by a fake camera that plays text: boxes over the text, the HUD, the
controls, phone layouts, refusals and reconnection after a server restart.

Screenshots land in artifacts/screenshots/; every test fails on any console error.
"""

from __future__ import annotations

import io
import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import Page

from ..support.browser import (
    Box,
    Hud,
    LoggedServerProcess,
    PageOpener,
    drawn_fraction,
    outline_coverage,
    read_hud,
    read_overlay,
    wait_for_hud,
)
from ..support.images import Scene, text_scene
from ..support.server import ServerProcess
from ..support.timing import T
from .camera import CAMERA_SIZE, camera_scene

pytestmark = pytest.mark.browser

TEXT_BOXES: list[Box] = camera_scene().text_boxes
# A part of the camera picture with no text in it: nothing may be drawn there.
NO_TEXT_REGION: Box = (420.0, 140.0, 630.0, 350.0)
# The colour the page gives class 0 (overlay.js classColour: hsl(40, 95%, 55%)).
CLASS0_RGB = (249, 177, 31)
BOXES_SHOWN = "h.state === 'open' && h.boxes >= 2"


def _assert_in(part: str, text: str) -> None:
    assert part in text, text


def eventually(check: Callable[[], None], timeout: float = 10) -> None:
    """Retry an assertion about the live picture until it holds (each frame is redrawn)."""
    deadline = time.monotonic() + T(timeout)
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def assert_boxes_over_text(
    page: Page,
    text_boxes: list[Box] = TEXT_BOXES,
    no_text: Box = NO_TEXT_REGION,
    size: tuple[int, int] = CAMERA_SIZE,
) -> None:
    """Drawn box outlines hug every line of text in the picture (source pixels), mapped
    onto the overlay canvas the way CSS object-fit places the picture; nothing is drawn
    where there is no text."""
    layout, alpha = read_overlay(page)
    assert (layout.nat_w, layout.nat_h) == size
    reach = max(3.0, layout.frame_px_to_canvas(10 * size[0] / CAMERA_SIZE[0]))
    for text_box in text_boxes:
        on_canvas = layout.to_canvas(text_box)
        coverage = outline_coverage(alpha, on_canvas, reach)
        assert coverage >= 0.9, (
            f"text at {text_box} (canvas {tuple(round(v) for v in on_canvas)}, fit "
            f"{layout.fit}) is outlined on only {coverage:.0%} of its edges"
        )
    assert drawn_fraction(alpha, layout.to_canvas(no_text)) == 0, "boxes where no text is"


def session_id(page: Page) -> str:
    m = re.search(r"session ([0-9a-f]+)", read_hud(page).connection_text)
    assert m, read_hud(page).connection_text
    return m.group(1)


def answered_count_settled(page: Page, timeout: float = 15) -> Hud:
    """The HUD once its answered count has stopped moving for a second."""
    deadline = time.monotonic() + T(timeout)
    before = read_hud(page)
    while True:
        time.sleep(1)
        now = read_hud(page)
        if now.answered == before.answered:
            return now
        assert time.monotonic() < deadline, "answers never stopped coming"
        before = now


def set_threshold_by_keys(page: Page, hundredths: int) -> None:
    """Move the threshold slider from 0 with the arrow keys, as a keyboard user would."""
    page.locator("#threshold").focus()
    page.keyboard.press("Home")
    for _ in range(hundredths):
        page.keyboard.press("ArrowRight")


def test_boxes_appear_over_the_text_and_the_hud_counts_rise(
    page_server: ServerProcess, open_page: PageOpener, screenshots: Path
) -> None:
    page, console = open_page(page_server.url + "/", 1280, 800)
    first = wait_for_hud(page, BOXES_SHOWN + " && h.answered >= 3")
    eventually(lambda: assert_boxes_over_text(page))

    later = wait_for_hud(page, f"h.answered >= {first.answered + 15} && h.latency_p95_ms !== null")
    assert later.answered_fps > 0 and later.sent_fps > 0
    assert later.latency_p50_ms is not None and later.latency_p95_ms is not None
    assert 0 < later.latency_p50_ms <= later.latency_p95_ms
    assert "infer" in later.server_text and "total" in later.server_text
    assert later.lost == 0
    page.screenshot(path=screenshots / "desktop-1280x800.png")
    (screenshots / "hud-desktop.json").write_text(json.dumps(later.__dict__, indent=2) + "\n")
    print(f"\nHUD on this machine: {later}")

    # The same boxes stay on the text when the picture is cropped to fill the stage.
    page.select_option("#fit", "cover")
    eventually(lambda: assert_boxes_over_text(page))
    page.screenshot(path=screenshots / "desktop-1280x800-cover.png")

    # "Show: analysed frame": the very frame the boxes belong to is drawn under them, over
    # the picture's place and nowhere else (the letterbox bands stay clear).
    page.select_option("#fit", "contain")
    page.select_option("#view", "analysed")

    def analysed_frame_drawn() -> None:
        layout, alpha = read_overlay(page)
        picture = layout.to_canvas((0, 0, *CAMERA_SIZE))
        assert drawn_fraction(alpha, picture) > 0.99
        assert picture[1] > 10, "expected letterbox bands at this size"
        assert drawn_fraction(alpha, (0, 0, layout.canvas_w, picture[1] - 2)) == 0

    eventually(analysed_frame_drawn)
    console.assert_clean()


def test_threshold_and_class_filter_change_what_the_server_sends(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_page(page_server.url + "/")
    wait_for_hud(page, BOXES_SHOWN)

    # Threshold 1.00: no text line scores that high, so results come back empty.
    set_threshold_by_keys(page, 0)
    page.keyboard.press("End")
    confirmed = wait_for_hud(page, "h.server_confidence === 1")
    after = wait_for_hud(page, f"h.answered >= {confirmed.answered + 5}")
    assert after.boxes == 0, f"threshold 1.0 still shows {after.boxes} boxes"
    _, alpha = read_overlay(page)
    assert not alpha.any(), "boxes drawn although the server sends none"

    set_threshold_by_keys(page, 30)
    confirmed = wait_for_hud(page, "h.server_confidence === 0.3")
    wait_for_hud(page, BOXES_SHOWN + f" && h.answered >= {confirmed.answered + 3}")

    # The class filter is built from the model's labels: unticking "text" filters all out.
    checkbox = page.get_by_label("text", exact=True)
    checkbox.uncheck()
    expect_text = page.locator("#server-settings")
    expect_text.filter(has_text="no classes").wait_for(timeout=T(10) * 1000)
    filtered = read_hud(page)
    after = wait_for_hud(page, f"h.answered >= {filtered.answered + 5}")
    assert after.boxes == 0
    checkbox.check()
    expect_text.filter(has_text="all classes").wait_for(timeout=T(10) * 1000)
    wait_for_hud(page, BOXES_SHOWN)
    console.assert_clean()


def test_keyboard_pause_holds_the_boxes_and_snapshot_saves_frame_with_boxes(
    page_server: ServerProcess, open_page: PageOpener, screenshots: Path
) -> None:
    page, console = open_page(page_server.url + "/")
    wait_for_hud(page, BOXES_SHOWN)

    page.keyboard.press("p")
    assert page.locator("#pause").get_attribute("aria-pressed") == "true"
    paused = answered_count_settled(page)  # the frame in flight at P is still answered
    time.sleep(2)  # well past the time after which live boxes fade
    still = read_hud(page)
    assert still.answered == paused.answered, "frames still sent while paused"
    assert still.boxes >= 2, "boxes of the frozen picture faded while paused"

    with page.expect_download(timeout=T(10) * 1000) as download:
        page.keyboard.press("s")
    saved = screenshots / "snapshot.png"
    download.value.save_as(saved)
    assert download.value.suggested_filename.endswith(".png")
    snap = np.asarray(Image.open(io.BytesIO(saved.read_bytes())).convert("RGB"))
    assert snap.shape[:2] == (CAMERA_SIZE[1], CAMERA_SIZE[0])
    for x1, y1, x2, y2 in TEXT_BOXES:
        # the box is drawn in the class colour just around the text
        band = snap[int(y1) - 12 : int(y2) + 12, int(x1) - 12 : int(x2) + 12].reshape(-1, 3)
        close = np.abs(band.astype(int) - CLASS0_RGB).max(axis=1) < 40
        assert close.sum() >= (x2 - x1), f"no box drawn around {(x1, y1, x2, y2)} in snapshot"
    assert not (np.abs(snap.astype(int) - CLASS0_RGB).max(axis=2) < 40)[300:, 450:].any()

    page.keyboard.press("p")
    assert page.locator("#pause").get_attribute("aria-pressed") == "false"
    wait_for_hud(page, f"h.answered >= {still.answered + 5}")
    console.assert_clean()


def test_image_file_source_sent_as_json_is_scaled_and_boxed(
    page_server: ServerProcess, open_page: PageOpener, tmp_path: Path
) -> None:
    """A still image chosen as a file, larger than what is sent: the page sends it scaled
    to the model's input size as base64 JSON, and maps the boxes back onto the full image."""
    scene = text_scene(1280, 720, texts=[("GAUGE 07", (700, 480))], font_size=64, seed=5)
    picture = tmp_path / "label.png"
    picture.write_bytes(scene.png())
    page, console = open_page(page_server.url + "/")
    wait_for_hud(page, "h.state === 'open'")
    page.select_option("#wire", "json")
    page.select_option("#source-kind", "file")
    page.set_input_files("#file", str(picture))
    wait_for_hud(page, "h.boxes >= 1 && h.answered >= 3")
    assert "1280×720 → 640×360" in page.locator("#hud-frame").inner_text()
    eventually(
        lambda: assert_boxes_over_text(
            page, scene.text_boxes, no_text=(60.0, 60.0, 560.0, 400.0), size=(1280, 720)
        )
    )
    console.assert_clean()


def test_video_file_source_plays_in_a_loop_and_is_boxed(
    page_server: ServerProcess, open_page: PageOpener, tmp_path: Path
) -> None:
    """A recorded clip chosen as a file (VP8 WebM, which Chromium plays without proprietary
    codecs): the page plays it, sends it scaled to the model's input, boxes land on its
    text, and frames keep coming after the clip's end because it loops."""
    size, fps, frames = (960, 540), 15, 30  # a 2 s clip
    clip = tmp_path / "clip.webm"
    scenes = _vp8_clip(clip, size, frames, fps)

    page, console = open_page(page_server.url + "/")
    wait_for_hud(page, "h.state === 'open'")
    page.select_option("#source-kind", "file")
    page.set_input_files("#file", str(clip))
    wait_for_hud(page, BOXES_SHOWN + " && h.answered >= 3")
    # Frames of the source shown before the file may have made those answers: the
    # clip's own frames are the ones at 960×540 (a full run once read 640×360 here).
    eventually(lambda: _assert_in("960×540 → 640×360", page.locator("#hud-frame").inner_text()))
    eventually(
        lambda: assert_boxes_over_text(
            page, scenes[0].text_boxes, no_text=(620.0, 40.0, 940.0, 520.0), size=size
        )
    )
    time.sleep(T(1.5 * frames / fps))  # well past the clip's end
    after_end = read_hud(page)
    wait_for_hud(page, f"h.answered >= {after_end.answered + 5}")
    assert page.evaluate("() => { const v = document.querySelector('video'); return !v.ended }")
    console.assert_clean()


def _vp8_clip(path: Path, size: tuple[int, int], frames: int, fps: int) -> list[Scene]:
    """A VP8 WebM of ``frames`` text scenes (which Chromium plays without proprietary
    codecs); the scenes, for where their text is."""
    texts = [("PALLET 3318", (90, 120)), ("BAY 12", (90, 330))]
    scenes = [text_scene(*size, texts=texts, font_size=60, seed=s) for s in range(frames)]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"VP80"), fps, size)
    assert writer.isOpened(), "OpenCV here cannot write VP8 WebM"
    for scene in scenes:
        writer.write(np.ascontiguousarray(scene.rgb[:, :, ::-1]))
    writer.release()
    return scenes


def test_a_file_chosen_while_the_camera_starts_stays_the_source(
    page_server: ServerProcess, open_page: PageOpener, tmp_path: Path
) -> None:
    """The camera the page opens on load is slow to start (its permission prompt, a
    phone's camera); the user picks a video file meanwhile. When the camera finally comes,
    it must not take the file's place: the file's frames (960×540) are the ones sent, and
    stay so after the camera would have started. (Seen in a full run: the camera's late
    start replaced the file, and the page went on sending the camera's 640×360.)"""
    clip = tmp_path / "clip.webm"
    _vp8_clip(clip, (960, 540), 30, 15)
    slow_camera = """
        const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
        navigator.mediaDevices.getUserMedia = (c) =>
            new Promise((r) => setTimeout(r, 3000)).then(() => open(c));
    """
    page, console = open_page(page_server.url + "/", init_script=slow_camera)
    wait_for_hud(page, "h.state === 'open'")
    page.select_option("#source-kind", "file")
    page.set_input_files("#file", str(clip))
    wait_for_hud(page, "h.answered >= 3")
    eventually(lambda: _assert_in("960×540 → 640×360", page.locator("#hud-frame").inner_text()))
    time.sleep(T(4.0))  # past the camera's start
    answered = read_hud(page).answered
    wait_for_hud(page, f"h.answered >= {answered + 5}")
    _assert_in("960×540 → 640×360", page.locator("#hud-frame").inner_text())
    assert page.evaluate("() => document.querySelector('video').srcObject === null")
    console.assert_clean()


def test_phone_portrait_and_landscape(
    page_server: ServerProcess, open_page: PageOpener, screenshots: Path
) -> None:
    page, console = open_page(page_server.url + "/", 390, 844, scale=3, mobile=True)
    wait_for_hud(page, BOXES_SHOWN)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "sideways scrolling"
    eventually(lambda: assert_boxes_over_text(page))
    layout, _ = read_overlay(page)
    assert layout.canvas_w == round(layout.css_w * 3), "overlay not drawn at device pixels"
    page.screenshot(path=screenshots / "phone-390x844-portrait.png")
    page.screenshot(path=screenshots / "phone-390x844-portrait-full.png", full_page=True)

    page.set_viewport_size({"width": 844, "height": 390})
    eventually(lambda: assert_boxes_over_text(page))
    assert page.evaluate("document.documentElement.scrollWidth") <= 844
    page.screenshot(path=screenshots / "phone-844x390-landscape.png")
    console.assert_clean()


def test_object_fit_geometry_in_the_browser(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    """geometry.js against hand-worked CSS Images 3 object-fit cases."""
    page, console = open_page(page_server.url + "/")
    got = page.evaluate(
        """async () => {
          const g = await import('/static/geometry.js');
          const r = (...a) => {
            const c = g.contentRect(...a);
            return [c.x, c.y, c.width, c.height];
          };
          return {
            contain: r(800, 600, 640, 360, 'contain'),
            cover: r(800, 600, 640, 360, 'cover'),
            fill: r(800, 600, 640, 360, 'fill'),
            none: r(800, 600, 640, 360, 'none'),
            scaleDown: r(800, 600, 640, 360, 'scale-down'),
            topLeft: r(800, 600, 640, 360, 'contain', '0% 0%'),
            px: r(800, 600, 640, 360, 'none', '10px 20px'),
            mapped: g.frameToCanvas({x: 0, y: 75, width: 800, height: 450}, 320, 180, 2)
              .box([10, 10, 20, 30]),
            send: g.sendSize(1920, 1080, 640),
          };
        }"""
    )
    assert got["contain"] == [0, 75, 800, 450]
    assert got["cover"] == pytest.approx([-133.333, 0, 1066.667, 600], abs=1e-3)
    assert got["fill"] == [0, 0, 800, 600]
    assert got["none"] == [80, 120, 640, 360]
    assert got["scaleDown"] == [80, 120, 640, 360]
    assert got["topLeft"] == [0, 0, 800, 450]
    assert got["px"] == [10, 20, 640, 360]
    assert got["mapped"] == [50, 200, 100, 300]  # scale 800/320 * 2 = 5, y offset 75 * 2
    assert got["send"] == {"width": 640, "height": 360}
    console.assert_clean()


def test_refusal_at_the_connection_limit_is_explained_then_cleared(
    open_page: PageOpener, tmp_path: Path, screenshots: Path
) -> None:
    server = LoggedServerProcess(
        "server.max_connections=1", log_path=tmp_path / "server.log"
    ).start()
    try:
        server.wait_ready_blocking()
        first, first_console = open_page(server.url + "/")
        wait_for_hud(first, BOXES_SHOWN)
        second, second_console = open_page(server.url + "/")
        with second_console.expect_server_down():
            refused = wait_for_hud(second, "/connection limit/.test(h.connection_text)")
            assert refused.state in ("waiting", "connecting")
            assert second.locator("#conn-state").is_visible()
            second.screenshot(path=screenshots / "refused-connection-limit.png")
            # The first page goes away; the second gets in by itself.
            first.close()
            wait_for_hud(second, BOXES_SHOWN, timeout=30)
        first_console.assert_clean()
        second_console.assert_clean()
    finally:
        open_page.close_all()
        server.stop()


@pytest.mark.parametrize(
    ("store", "stop_with"),
    [
        ("memory", signal.SIGTERM),
        pytest.param("redis", signal.SIGTERM, marks=pytest.mark.redis),
        pytest.param("redis", signal.SIGKILL, marks=pytest.mark.redis),
    ],
    ids=["memory-restart", "redis-restart", "redis-crash"],
)
def test_page_reconnects_by_itself_after_the_server_goes_away(
    store: str,
    stop_with: signal.Signals,
    request: pytest.FixtureRequest,
    open_page: PageOpener,
    tmp_path: Path,
) -> None:
    """memory-restart: the restarted server has forgotten the session, so the page opens a
    new one and re-sends its settings. redis-restart: the server says ``closing`` and the
    session, kept in Redis, is resumed. redis-crash: the server dies without a word (as when
    the network drops: no ``closing``, no close frame) and the session is still resumed."""
    sets: list[str] = []
    if store == "redis":
        sets.append(f"state.redis_url={request.getfixturevalue('redis_server').url}")
    log = tmp_path / "server.log"
    server = LoggedServerProcess(*sets, log_path=log).start()
    try:
        server.wait_ready_blocking()
        page, console = open_page(server.url + "/")
        wait_for_hud(page, BOXES_SHOWN)
        set_threshold_by_keys(page, 30)
        wait_for_hud(page, "h.server_confidence === 0.3")
        old_session = session_id(page)

        with console.expect_server_down():
            if stop_with == signal.SIGKILL:
                server.signal(signal.SIGKILL)
                assert server.proc is not None
                server.proc.wait(T(10))
            else:
                server.stop()
            # Results stop: the boxes fade away instead of lingering over the picture.
            gone = wait_for_hud(page, "h.state !== 'open' && h.boxes === 0", timeout=15)
            _, alpha = read_overlay(page)
            assert not alpha.any(), "stale boxes still drawn"
            server = LoggedServerProcess(*sets, port=server.port, log_path=log).start()
            server.wait_ready_blocking()
            back = wait_for_hud(
                page,
                BOXES_SHOWN + f" && h.answered >= {gone.answered + 3}"
                " && h.server_confidence === 0.3",
                timeout=30,
            )
        if store == "redis":
            assert f"session {old_session} (resumed)" in back.connection_text
        else:
            assert session_id(page) != old_session
            assert "new session" in back.connection_text
        eventually(lambda: assert_boxes_over_text(page))
        console.assert_clean()
        print(f"\nwhile the server was down Chromium logged: {sorted(set(console.tolerated))}")
    finally:
        open_page.close_all()
        server.stop()


def test_a_server_that_stops_answering_is_noticed_and_left(
    open_page: PageOpener, tmp_path: Path
) -> None:
    """The server process is frozen (SIGSTOP): its sockets stay open and nothing comes back,
    as on a network that died without TCP noticing. The page counts the unanswered frame as
    lost, gives the silent connection up with a reason on screen, and once the server runs
    again (SIGCONT) it is back on the same session by itself."""
    server = LoggedServerProcess(log_path=tmp_path / "server.log").start()
    try:
        server.wait_ready_blocking()
        page, console = open_page(server.url + "/")
        wait_for_hud(page, BOXES_SHOWN + " && h.answered >= 3")
        old_session = session_id(page)
        with console.expect_server_down():
            server.signal(signal.SIGSTOP)
            try:
                frozen = wait_for_hud(page, "h.lost >= 1", timeout=20)  # 10 s answer timeout
                wait_for_hud(  # 15 s without any message, checked at the 5 s ping
                    page,
                    "h.state === 'waiting' && h.connection_text.includes('stopped answering')",
                    timeout=30,
                )
            finally:
                server.signal(signal.SIGCONT)
            back = wait_for_hud(
                page, BOXES_SHOWN + f" && h.answered >= {frozen.answered + 3}", timeout=30
            )
        assert f"session {old_session} (resumed)" in back.connection_text
        eventually(lambda: assert_boxes_over_text(page))
        console.assert_clean()
    finally:
        server.signal(signal.SIGCONT)  # never leave a frozen process behind
        open_page.close_all()
        server.stop()
