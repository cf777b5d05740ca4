"""Headless Chromium from Debian's ``chromium`` package, driven by Playwright's sync API.

Never ``playwright install``: the tests use the system browser at :data:`CHROMIUM`, which
``scripts/test`` installs when missing. Chromium's fake camera plays a .y4m file
(``--use-file-for-fake-video-capture``) and grants camera permission without a prompt.
"""

from __future__ import annotations

import base64
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Error, Page

from .images import U8Array
from .server import ServerProcess
from .timing import T

CHROMIUM = Path("/usr/bin/chromium")

# Quiet, deterministic, no network of its own, software rendering on a machine without GPU.
BASE_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--mute-audio",
]


def chromium_args(fake_camera: Path | None = None) -> list[str]:
    """Launch arguments; with ``fake_camera`` (a .y4m file) getUserMedia plays that file."""
    args = list(BASE_ARGS)
    if fake_camera is not None:
        args += [
            "--use-fake-device-for-media-stream",
            "--use-fake-ui-for-media-stream",
            f"--use-file-for-fake-video-capture={fake_camera}",
        ]
    return args


class LoggedServerProcess(ServerProcess):
    """:class:`ServerProcess` with a blocking wait for readiness, for sync browser tests."""

    def wait_ready_blocking(self, timeout: float = 60) -> None:
        """Block until /readyz says ready (sync: these tests drive a sync browser API)."""
        try:
            wait_http_ok(self.url + "/readyz", timeout)
        except TimeoutError as e:
            alive = self.proc is not None and self.proc.poll() is None
            raise TimeoutError(f"{e}; process alive: {alive}; log:\n{self.log()}") from None


@contextmanager
def ready_server(*sets: str, log_path: Path) -> Iterator[ServerProcess]:
    """A :class:`LoggedServerProcess` with the ``--set`` values ``sets``, ready (its
    /readyz says so) for the ``with`` block, stopped after it."""
    server = LoggedServerProcess(*sets, log_path=log_path).start()
    try:
        server.wait_ready_blocking()
        yield server
    finally:
        server.stop()


def wait_http_ok(url: str, timeout: float = 60) -> None:
    """Poll ``url`` until it answers 200 (a server's /readyz after warm-up)."""
    deadline = time.monotonic() + T(timeout)
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
                last = r.status
        except urllib.error.HTTPError as e:  # 503 while warming up: it holds a socket
            last = e.code
            e.close()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {T(timeout):.0f} s (last: {last})")


# What Chromium itself logs (as console errors) for a connection attempt while the server is
# down, shutting down or warming up: expected only while a test has stopped the server.
SERVER_DOWN_NOISE = (
    re.compile(r"^WebSocket connection to 'ws://127\.0\.0\.1:\d+/ws[^']*' failed"),
    # 426: the page asked why its socket was refused just after the refusal cleared (the
    # server answers "no refusal now"), and retries; a race the page handles, not an error.
    re.compile(
        r"^Failed to load resource: (net::ERR_CONNECTION_REFUSED|net::ERR_CONNECTION_RESET|"
        r"net::ERR_EMPTY_RESPONSE|the server responded with a status of (503|426))"
    ),
)


@dataclass
class ConsoleWatch:
    """Every console error and uncaught exception of a page; a test fails on any of them,
    except browser network noise inside an :meth:`expect_server_down` window."""

    errors: list[str] = field(default_factory=list)
    tolerated: list[str] = field(default_factory=list)
    _allowed: tuple[re.Pattern[str], ...] = ()

    def attach(self, page: Page) -> ConsoleWatch:
        page.on("console", self._on_console)
        page.on("pageerror", self._on_page_error)
        return self

    def _on_console(self, msg: ConsoleMessage) -> None:
        if msg.type != "error":
            return
        text = msg.text
        if any(p.search(text) for p in self._allowed):
            self.tolerated.append(text)
        else:
            loc = msg.location
            self.errors.append(f"console.error: {text} ({loc.get('url')}:{loc.get('lineNumber')})")

    def _on_page_error(self, err: Error) -> None:
        self.errors.append(f"uncaught: {err.message}\n{err.stack}")

    @contextmanager
    def expect_server_down(
        self, patterns: Iterable[re.Pattern[str]] = SERVER_DOWN_NOISE
    ) -> Iterator[None]:
        """Inside: Chromium's own log lines for refused or failed connections are expected
        (the test stopped the server or made it refuse); anything else still fails."""
        previous = self._allowed
        self._allowed = tuple(patterns)
        try:
            yield
        finally:
            self._allowed = previous

    def assert_clean(self) -> None:
        assert not self.errors, "console errors on the page:\n" + "\n".join(self.errors)


class PageOpener:
    """Opens pages, each in its own browser context (fresh storage, its own viewport), with a
    :class:`ConsoleWatch` attached. :meth:`close_all` before stopping a server the pages talk
    to, or their reconnect attempts log errors."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.contexts: list[BrowserContext] = []
        self.watches: list[ConsoleWatch] = []

    def __call__(
        self,
        url: str,
        width: int = 1280,
        height: int = 800,
        scale: float = 1,
        mobile: bool = False,
        init_script: str | None = None,
        no_favicon: bool = False,
    ) -> tuple[Page, ConsoleWatch]:
        """``init_script``: JavaScript run in the page before its own (to slow a browser
        API down, say). ``no_favicon``: answer /favicon.ico with 204, for a page that is not
        the overlay page (a node's /healthz, say), whose icon request a node answers 404."""
        context = self.browser.new_context(
            viewport={"width": width, "height": height},
            device_scale_factor=scale,
            is_mobile=mobile,
            has_touch=mobile,
            accept_downloads=True,
        )
        self.contexts.append(context)
        if init_script is not None:
            context.add_init_script(init_script)
        if no_favicon:
            context.route("**/favicon.ico", lambda route: route.fulfill(status=204))
        page = context.new_page()
        watch = ConsoleWatch().attach(page)
        self.watches.append(watch)
        page.goto(url)
        return page, watch

    def close_all(self) -> None:
        while self.contexts:
            self.contexts.pop().close()


@dataclass(frozen=True)
class Hud:
    """What the page's heads-up display shows (read from its elements)."""

    state: str
    connection_text: str
    answered: int
    boxes: int
    sent_fps: float
    answered_fps: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    server_text: str
    dropped_by_server: int
    lost: int
    server_confidence: float | None

    @property
    def latency_text(self) -> str:
        return f"p50 {self.latency_p50_ms} ms, p95 {self.latency_p95_ms} ms"


_READ_HUD = """() => {
  const d = (id) => document.getElementById(id);
  const ms = (v) => (v === '' || v === undefined ? null : Number(v));
  const conf = d('server-settings').dataset.confidence;
  return {
    state: d('conn-state').dataset.kind,
    connection_text: d('conn-state').textContent.trim(),
    answered: Number(d('hud-answered').dataset.value),
    boxes: Number(d('hud-boxes').dataset.value),
    sent_fps: Number(d('hud-sent-fps').dataset.value),
    answered_fps: Number(d('hud-answered-fps').dataset.value),
    latency_p50_ms: ms(d('hud-latency').dataset.p50),
    latency_p95_ms: ms(d('hud-latency').dataset.p95),
    server_text: d('hud-server').textContent,
    dropped_by_server: Number(d('hud-dropped').dataset.server),
    lost: Number(d('hud-dropped').dataset.lost),
    server_confidence: conf === undefined ? null : Number(conf),
  };
}"""


def read_hud(page: Page) -> Hud:
    values: dict[str, Any] = page.evaluate(_READ_HUD)
    return Hud(**values)


def wait_for_hud(page: Page, condition_js: str, timeout: float = 20) -> Hud:
    """Wait until ``condition_js`` (an expression over ``h``, the HUD values) holds."""
    page.wait_for_function(
        f"() => {{ const h = ({_READ_HUD})(); return {condition_js}; }}",
        timeout=T(timeout) * 1000,
    )
    return read_hud(page)


# -- the overlay canvas, read back ---------------------------------------------------------

Box = tuple[float, float, float, float]

_READ_LAYOUT = """() => {
  const img = document.getElementById('image');
  const v = img.hidden ? document.getElementById('video') : img;
  const c = document.getElementById('overlay');
  const vr = v.getBoundingClientRect(), cr = c.getBoundingClientRect();
  const s = getComputedStyle(v);
  return {
    box_w: v.clientWidth, box_h: v.clientHeight,
    nat_w: v.videoWidth || v.naturalWidth, nat_h: v.videoHeight || v.naturalHeight,
    off_x: vr.left - cr.left + v.clientLeft, off_y: vr.top - cr.top + v.clientTop,
    css_w: cr.width, css_h: cr.height, canvas_w: c.width, canvas_h: c.height,
    fit: s.objectFit, position: s.objectPosition,
  };
}"""

_READ_ALPHA = """() => {
  const c = document.getElementById('overlay');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const alpha = new Uint8Array(c.width * c.height);
  for (let i = 0; i < alpha.length; i++) alpha[i] = px[i * 4 + 3];
  let s = '';
  for (let i = 0; i < alpha.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, alpha.subarray(i, i + 0x8000));
  }
  return {layout: (LAYOUT)(), alpha: btoa(s)};
}""".replace("LAYOUT", _READ_LAYOUT)


@dataclass(frozen=True)
class OverlayLayout:
    """Where the <video> (or the <img> of a still) paints its picture, relative to the
    overlay canvas."""

    box_w: float
    box_h: float
    nat_w: float
    nat_h: float
    off_x: float
    off_y: float
    css_w: float
    css_h: float
    canvas_w: int
    canvas_h: int
    fit: str
    position: str

    def to_canvas(self, box: Box) -> Box:
        """Source-frame pixels → overlay-canvas pixels, worked out here from CSS Images 3
        object-fit (centred, the page's object-position) independently of the page's code."""
        if self.position != "50% 50%":
            raise ValueError(f"only centred pictures are mapped here, not {self.position}")
        sx_fit, sy_fit = self.box_w / self.nat_w, self.box_h / self.nat_h
        if self.fit == "fill":
            sx, sy = sx_fit, sy_fit
        elif self.fit == "cover":
            sx = sy = max(sx_fit, sy_fit)
        elif self.fit == "contain":
            sx = sy = min(sx_fit, sy_fit)
        else:
            raise ValueError(f"object-fit {self.fit} not mapped here")
        x0 = self.off_x + (self.box_w - self.nat_w * sx) / 2
        y0 = self.off_y + (self.box_h - self.nat_h * sy) / 2
        ux, uy = self.canvas_w / self.css_w, self.canvas_h / self.css_h
        x1, y1, x2, y2 = box
        return ((x0 + x1 * sx) * ux, (y0 + y1 * sy) * uy, (x0 + x2 * sx) * ux, (y0 + y2 * sy) * uy)

    def frame_px_to_canvas(self, d: float) -> float:
        """A length in source pixels, in canvas pixels (horizontal scale)."""
        x1, _, x2, _ = self.to_canvas((0, 0, d, 0))
        return x2 - x1


def read_overlay_layout(page: Page) -> OverlayLayout:
    values: dict[str, Any] = page.evaluate(_READ_LAYOUT)
    return OverlayLayout(**values)


def read_overlay(page: Page) -> tuple[OverlayLayout, U8Array]:
    """The layout and the overlay canvas's alpha channel, a (height, width) uint8 array, read
    in one go so both describe the same drawing."""
    values: dict[str, Any] = page.evaluate(_READ_ALPHA)
    layout = OverlayLayout(**values["layout"])
    raw = base64.b64decode(values["alpha"])
    return layout, np.frombuffer(raw, np.uint8).reshape(layout.canvas_h, layout.canvas_w)


def outline_coverage(alpha: U8Array, box: Box, reach: float, step: float = 3.0) -> float:
    """How much of ``box``'s outline (canvas pixels) has something drawn within ``reach``
    pixels across it: 1.0 when a drawn box hugs it all round. Points of the outline that fall
    outside the canvas (a cropped picture) are not counted."""
    h, w = alpha.shape
    x1, y1, x2, y2 = box
    r = max(1, round(reach))
    hits = total = 0
    for x in np.arange(x1, x2 + 1e-6, step):
        for y in (y1, y2):
            xi, yi = round(x), round(y)
            if 0 <= xi < w and 0 <= yi < h:
                total += 1
                hits += bool(alpha[max(0, yi - r) : yi + r + 1, xi].any())
    for y in np.arange(y1, y2 + 1e-6, step):
        for x in (x1, x2):
            xi, yi = round(x), round(y)
            if 0 <= xi < w and 0 <= yi < h:
                total += 1
                hits += bool(alpha[yi, max(0, xi - r) : xi + r + 1].any())
    if total == 0:
        raise AssertionError(f"box {box} lies wholly outside the {w}x{h} canvas")
    return hits / total


def drawn_fraction(alpha: U8Array, box: Box) -> float:
    """Share of the pixels inside ``box`` (canvas pixels, clipped) that have anything drawn."""
    h, w = alpha.shape
    x1, y1 = max(0, round(box[0])), max(0, round(box[1]))
    x2, y2 = min(w, round(box[2])), min(h, round(box[3]))
    if x2 <= x1 or y2 <= y1:
        raise AssertionError(f"box {box} lies wholly outside the {w}x{h} canvas")
    return float((alpha[y1:y2, x1:x2] > 0).mean())
