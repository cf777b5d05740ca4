"""The overlay page lists the session's events (protocol 3, docs/events.md) in headless
Chromium against the real service: a node whose rule raises ``appear`` for a label in its
zone; the fake camera shows one label in the zone and one outside it. The list gets one
item for the label in the zone (once per track, however many frames show it), and none
for the other; the page keeps streaming without a console error."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from ..support.browser import PageOpener, read_hud, ready_server, wait_for_hud
from ..support.server import ServerProcess
from ..support.timing import T

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# The camera (camera.py): "SERIAL 4711-AB" near the top, "LOT 22" below the middle of a
# 640x360 picture. The zone is the lower half: only "LOT 22" stands in it.
ZONE = {"lower": [[0, 0.5], [1, 0.5], [1, 1], [0, 1]]}
RULE = [{"name": "lot-in-lower", "on": "appear", "zone": "lower"}]


@pytest.fixture(scope="module")
def events_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ready_server(
        f"events.zones={json.dumps(ZONE)}", f"events.rules={json.dumps(RULE)}", log_path=log
    ) as server:
        yield server


def test_the_page_lists_each_event_once_and_keeps_streaming(
    events_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_page(events_server.url + "/")
    assert page.locator("#events-none").is_visible()
    wait_for_hud(page, "h.state === 'open' && h.boxes >= 2")
    item = page.locator('#events li[data-rule="lot-in-lower"][data-on="appear"]')
    try:
        item.first.wait_for(timeout=T(30) * 1000)
    except PlaywrightTimeoutError:
        raise AssertionError(f"no event listed; server log:\n{events_server.log()}") from None
    text = item.first.inner_text()
    assert "lot-in-lower · appear · #" in text, text
    assert not page.locator("#events-none").is_visible()
    # More frames of the same labels: the same track, nothing more to list.
    answered = read_hud(page).answered
    wait_for_hud(page, f"h.answered >= {answered + 10}")
    assert page.locator("#events li").count() == 1
    console.assert_clean()
