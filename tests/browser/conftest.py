"""Fixtures for the overlay-page tests: the real service as a child process, Debian's
Chromium with a fake camera that plays a generated .y4m, one fresh browser context per test
that fails the test on any console error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from ..support.browser import CHROMIUM, PageOpener, chromium_args, ready_server
from ..support.server import ServerProcess
from ..support.y4m import write_y4m
from .camera import CAMERA_FRAMES, camera_scene

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"


@pytest.fixture(scope="module", autouse=True)
def _chromium_present() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: Debian's chromium package (scripts/test installs it)")


@pytest.fixture(scope="module")
def camera_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("camera") / "text.y4m"
    return write_y4m(path, (camera_scene(seed).rgb for seed in range(CAMERA_FRAMES)), fps=15)


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m edge_vision serve`` with the default model, serving the page at /."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ready_server(log_path=log) as server:
        yield server


@pytest.fixture(scope="module")
def browser(camera_file: Path) -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=chromium_args(camera_file)
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def open_page(browser: Browser) -> Iterator[PageOpener]:
    """``open_page(url, width=, height=, scale=, mobile=)`` → (page, console watch)."""
    opener = PageOpener(browser)
    yield opener
    opener.close_all()
    # A backstop for errors logged after the test's own check (while closing, say).
    for watch in opener.watches:
        watch.assert_clean()
