"""Zones and lines on the overlay page (protocol 3, docs/events.md, "Zones on the overlay
page") in headless Chromium against the real service: the node's configured zone and line
are drawn over the picture (hello's ``events``), a zone drawn with the mouse becomes part
of the session's settings (the admin API says so) and its ``appear`` rule's event is
listed, a removed one leaves the session, and Escape cancels a drawing, from the keyboard
and from the naming dialog, sending nothing."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from ..support.browser import PageOpener, ready_server, wait_for_hud
from ..support.server import ServerProcess
from ..support.timing import T

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

# The camera (camera.py): "SERIAL 4711-AB" at the top (its box's bottom centre, the anchor,
# near (0.3, 0.29) of the 640x360 picture), "LOT 22" lower down (anchor near (0.2, 0.67)).
# The node's zone holds the serial's anchor only; its line runs left to right below it.
NODE_ZONES = {"top": [[0, 0], [1, 0], [1, 0.4], [0, 0.4]]}
NODE_LINES = {"gate": [[0.05, 0.55], [0.95, 0.55]]}
# What the test draws: a box round the lot code's anchor, below the node's zone.
DRAWN = [(0.02, 0.5), (0.6, 0.5), (0.6, 0.95), (0.02, 0.95)]

# Where a fraction of the frame is on screen: the video's content box (object-fit: contain).
_SCREEN_POINT = """([fx, fy]) => {
  const v = document.getElementById('video');
  const r = v.getBoundingClientRect();
  const s = Math.min(r.width / v.videoWidth, r.height / v.videoHeight);
  const w = v.videoWidth * s, h = v.videoHeight * s;
  return [r.left + (r.width - w) / 2 + fx * w, r.top + (r.height - h) / 2 + fy * h];
}"""

# The overlay canvas's pixel (RGBA) under a fraction of the frame.
_CANVAS_PIXEL = """([fx, fy]) => {
  const v = document.getElementById('video'), c = document.getElementById('overlay');
  const r = v.getBoundingClientRect(), cr = c.getBoundingClientRect();
  const s = Math.min(r.width / v.videoWidth, r.height / v.videoHeight);
  const w = v.videoWidth * s, h = v.videoHeight * s;
  const unit = c.width / cr.width;
  const x = (r.left - cr.left + (r.width - w) / 2 + fx * w) * unit;
  const y = (r.top - cr.top + (r.height - h) / 2 + fy * h) * unit;
  return Array.from(c.getContext('2d').getImageData(Math.round(x), Math.round(y), 1, 1).data);
}"""


@pytest.fixture(scope="module")
def zones_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ready_server(
        f"events.zones={json.dumps(NODE_ZONES)}",
        f"events.lines={json.dumps(NODE_LINES)}",
        log_path=log,
    ) as server:
        yield server


def session_id(page: Page) -> str:
    text = page.locator("#conn-state").inner_text()
    m = re.search(r"session ([0-9a-f]+)", text)
    assert m, text
    return m.group(1)


def session_record(server: ServerProcess, sid: str) -> dict[str, Any]:
    with urllib.request.urlopen(server.url + "/api/sessions", timeout=5) as r:
        sessions = json.loads(r.read())["sessions"]
    (found,) = [s for s in sessions if s["id"] == sid]
    return dict(found)


def open_streaming(open_page: PageOpener, server: ServerProcess) -> tuple[Page, Any]:
    page, console = open_page(server.url + "/")
    wait_for_hud(page, "h.state === 'open' && h.boxes >= 2")
    return page, console


def click_at(page: Page, fraction: tuple[float, float], double: bool = False) -> None:
    x, y = page.evaluate(_SCREEN_POINT, list(fraction))
    if double:
        page.mouse.dblclick(x, y)
    else:
        page.mouse.click(x, y)


def regions(page: Page) -> list[dict[str, Any]]:
    drawn: list[dict[str, Any]] = json.loads(
        page.locator("#overlay").get_attribute("data-regions") or "[]"
    )
    return drawn


def wait_regions(page: Page, condition: str) -> None:
    """Until ``condition`` (over ``r``, the regions drawn) holds: drawn on an animation frame."""
    page.wait_for_function(
        "() => { const r = JSON.parse(document.getElementById('overlay').dataset.regions "
        f"|| '[]'); return {condition}; }}",
        timeout=T(5) * 1000,
    )


def test_the_nodes_configured_zone_and_line_are_drawn_over_the_picture(
    zones_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_streaming(open_page, zones_server)
    page.wait_for_function(
        "() => JSON.parse(document.getElementById('overlay').dataset.regions || '[]').length === 2",
        timeout=T(10) * 1000,
    )
    drawn = {r["name"]: r for r in regions(page)}
    assert drawn["top"]["kind"] == "zone" and drawn["top"]["source"] == "node"
    assert drawn["gate"]["kind"] == "line" and drawn["gate"]["source"] == "node"
    # Where they were drawn: the configured fractions of the picture on screen.
    for name, fractions in (("top", NODE_ZONES["top"]), ("gate", NODE_LINES["gate"])):
        want = [page.evaluate(_SCREEN_POINT, p) for p in fractions]
        origin = page.evaluate(
            "() => { const r = document.getElementById('overlay').getBoundingClientRect(); "
            "return [r.left, r.top]; }"
        )
        got = [(x + origin[0], y + origin[1]) for x, y in drawn[name]["points"]]  # scale 1
        for (gx, gy), (wx, wy) in zip(got, want, strict=True):
            assert abs(gx - wx) < 1.5 and abs(gy - wy) < 1.5, (name, got, want)
    # And on the canvas: the zone's translucent fill inside it, nothing outside both.
    inside = page.evaluate(_CANVAS_PIXEL, [0.9, 0.12])
    assert 0 < inside[3] < 255, inside  # filled, translucent
    assert page.evaluate(_CANVAS_PIXEL, [0.9, 0.85])[3] == 0
    # The line's arrow points to its forward side (down, for a line drawn left to right).
    below = page.evaluate(_CANVAS_PIXEL, [0.5, 0.55 + 0.02])
    above = page.evaluate(_CANVAS_PIXEL, [0.5, 0.55 - 0.02])
    assert below[3] > 0 and above[3] == 0, (below, above)
    # A detection in the zone names it on its label (the results' zones).
    page.wait_for_function(
        "() => JSON.parse(document.getElementById('overlay').dataset.labels || '[]')"
        ".some(l => l.text.endsWith(' · top'))",
        timeout=T(10) * 1000,
    )
    items = page.locator('#zones li[data-source="node"]')
    assert items.count() == 2 and page.locator("#zones li button").count() == 0
    console.assert_clean()


def test_a_drawn_zone_joins_the_sessions_settings_and_its_events_are_listed(
    zones_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_streaming(open_page, zones_server)
    sid = session_id(page)
    page.locator("#draw-zone").click()
    assert page.locator("#draw-zone").get_attribute("aria-pressed") == "true"
    for p in DRAWN[:-1]:
        click_at(page, p)
    click_at(page, DRAWN[-1], double=True)  # the last corner, and close
    dialog = page.locator("#zone-dialog")
    dialog.wait_for(state="visible", timeout=T(5) * 1000)
    page.locator("#zone-name").fill("dock")
    assert page.locator("#zone-appear").is_checked()
    page.locator("#zone-add").click()
    dialog.wait_for(state="hidden", timeout=T(10) * 1000)
    page.locator('#zones li[data-name="dock"][data-source="session"]').wait_for()
    assert page.locator("#draw-zone").get_attribute("aria-pressed") == "false"

    # The server's session holds the zone, at the corners clicked, and its rule.
    events = session_record(zones_server, sid)["events"]
    corners = events["zones"]["dock"]
    assert len(corners) == len(DRAWN)
    for (x, y), (wx, wy) in zip(corners, DRAWN, strict=True):
        assert abs(x - wx) < 0.01 and abs(y - wy) < 0.01, corners
    assert events["rules"] == [{"name": "dock-appear", "on": "appear", "zone": "dock"}]
    # Drawn, and the lot code standing in it says so; its appear event is listed.
    wait_regions(page, "r.some(z => z.name === 'dock' && z.source === 'session')")
    item = page.locator('#events li[data-rule="dock-appear"][data-on="appear"]')
    try:
        item.first.wait_for(timeout=T(15) * 1000)
    except PlaywrightTimeoutError:
        raise AssertionError(f"no event listed; server log:\n{zones_server.log()}") from None
    page.wait_for_function(
        "() => JSON.parse(document.getElementById('overlay').dataset.labels || '[]')"
        ".some(l => l.text.endsWith(' · dock'))",
        timeout=T(10) * 1000,
    )

    # Removed: gone from the page and from the session, rule and all.
    page.locator('#zones li[data-name="dock"] button').click()
    page.locator('#zones li[data-name="dock"]').wait_for(state="detached")
    record = session_record(zones_server, sid)
    assert not record.get("events", {}).get("zones"), record
    wait_regions(page, "r.length === 2 && !r.some(z => z.name === 'dock')")
    console.assert_clean()


def test_escape_cancels_a_drawing_from_the_keyboard_and_from_the_name_dialog(
    zones_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_streaming(open_page, zones_server)
    sid = session_id(page)
    button = page.locator("#draw-zone")
    # Keyboard only: the button, the arrow keys and Space put two corners down.
    button.focus()
    page.keyboard.press("Enter")
    assert button.get_attribute("aria-pressed") == "true"
    for key in ["Shift+ArrowLeft", "Space", "Shift+ArrowDown", "Space"]:
        page.keyboard.press(key)
    # The page's record of the drawing (updated on the next animation frame).
    page.wait_for_function(
        "() => document.getElementById('overlay').dataset.draft === '[[0.45,0.5],[0.45,0.55]]'",
        timeout=T(5) * 1000,
    )
    assert "2 points" in page.locator("#zone-help").inner_text()
    page.keyboard.press("Escape")
    assert button.get_attribute("aria-pressed") == "false"
    page.wait_for_function("() => document.getElementById('overlay').dataset.draft === ''")
    assert page.evaluate("() => document.activeElement.id") == "draw-zone"
    assert "cancelled" in page.locator("#zone-help").inner_text()

    # Three corners and a double click open the name dialog; Escape there drops the zone.
    button.click()
    for p in DRAWN[:2]:
        click_at(page, p)
    click_at(page, DRAWN[2], double=True)
    dialog = page.locator("#zone-dialog")
    dialog.wait_for(state="visible", timeout=T(5) * 1000)
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden", timeout=T(5) * 1000)
    # The dialog's close event (which ends the drawing) is a task queued after it hides.
    page.wait_for_function(
        "() => document.getElementById('draw-zone').getAttribute('aria-pressed') === 'false'",
        timeout=T(5) * 1000,
    )
    page.wait_for_function("() => document.getElementById('overlay').dataset.draft === ''")
    assert page.locator('#zones li[data-source="session"]').count() == 0
    assert "events" not in session_record(zones_server, sid)
    console.assert_clean()
