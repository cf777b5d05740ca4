"""The dashboard's event-sinks panel (/dashboard, docs/events.md, "The dashboard") in
headless Chromium: against a node whose rule raises ``appear`` for each label the fake
camera shows and whose events go to a real redis-server, the panel shows the Redis sink up,
with what it delivered (no more than the stream holds) and nothing queued or dropped; a
node without sinks shows the empty state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ..support.browser import PageOpener, ready_server, wait_for_hud
from ..support.redis_server import RedisServer
from ..support.server import ServerProcess
from ..support.timing import T

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(120)]

RULES = [{"name": "label-seen", "on": "appear"}]
STREAM = "edge-vision:events"


@pytest.fixture
def sink_server(redis_server: RedisServer, tmp_path: Path) -> Iterator[ServerProcess]:
    with ready_server(
        f"events.rules={json.dumps(RULES)}",
        f"events.sinks={json.dumps({'redis': {'url': redis_server.url}})}",
        log_path=tmp_path / "server.log",
    ) as server:
        yield server


def cell(row: str, field: str) -> str:
    return f'#sinks tr[data-sink="{row}"] [data-field="{field}"]'


def test_the_panel_shows_what_a_real_redis_sink_delivered(
    sink_server: ServerProcess, redis_server: RedisServer, open_page: PageOpener
) -> None:
    camera, camera_console = open_page(sink_server.url + "/")
    wait_for_hud(camera, "h.state === 'open' && h.boxes >= 2")
    camera.locator('#events li[data-rule="label-seen"]').first.wait_for(timeout=T(15) * 1000)

    page, console = open_page(sink_server.url + "/dashboard", no_favicon=True)
    page.wait_for_function(
        f"() => Number(document.querySelector('{cell('redis', 'delivered')}')?.dataset.value) >= 1",
        timeout=T(15) * 1000,
    )
    delivered = int(page.locator(cell("redis", "delivered")).get_attribute("data-value") or "")
    with redis.Redis.from_url(redis_server.url) as r:
        in_stream = r.xlen(STREAM)
    assert 1 <= delivered <= in_stream, (delivered, in_stream)
    assert page.locator(cell("redis", "delivered")).inner_text() == str(delivered)
    assert page.locator(cell("redis", "state")).inner_text() == "up"
    assert page.locator(cell("redis", "queued")).get_attribute("data-value") == "0"
    assert page.locator(cell("redis", "dropped")).get_attribute("data-value") == "0"
    assert page.locator(cell("redis", "latency_mean")).inner_text().endswith("ms")
    assert page.locator("#sinks tbody tr").count() == 1
    assert not page.locator("#sinks-empty").is_visible()
    assert page.locator("#dash-state").get_attribute("data-kind") == "open"
    console.assert_clean()
    camera_console.assert_clean()


def test_a_node_without_sinks_shows_the_empty_state(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = open_page(page_server.url + "/dashboard", no_favicon=True)
    page.locator("#sinks-empty").wait_for(state="visible", timeout=T(10) * 1000)
    assert not page.locator("#sinks").is_visible()
    assert page.locator('#node dd[data-metric="engine"]').inner_text() != "—"
    console.assert_clean()
