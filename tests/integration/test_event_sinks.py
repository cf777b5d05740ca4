"""Events reach the plant (docs/events.md, "Sinks"): a real mosquitto, a real redis-server
and a real HTTP receiver on loopback, a real server streamed to by the real client.

* the same event, with the same id and fields, reaches the session's WebSocket, MQTT
  (topic per rule, QoS 1), a Redis stream and a signed webhook;
* a broker stopped for 10 s while events fire: once it is back every event arrives, in
  order, none twice; the same for Redis restarted empty and a webhook receiver away;
* the service restarted with events queued for a sink that is down: they arrive after the
  restart (the outbox file);
* a full outbox drops its oldest, counted; a webhook's 4xx drops that event, counted, and
  the next ones go;
* ``leave`` reaches the sinks when a session ends, and when its camera is gone for good.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import cv2
import numpy as np
import orjson
import pytest
from redis import asyncio as aioredis

from edge_vision.client import EdgeVisionClient, Event
from edge_vision.common.redis_client import driver_info_options

from ..support.clients import camera_client
from ..support.cluster import wait_until
from ..support.images import Scene, text_scene
from ..support.lab import small_bench
from ..support.mosquitto import Mosquitto, MqttListener
from ..support.redis_server import RedisServer
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer, make_config, running_server
from ..support.timing import T
from ..support.webhook import WebhookReceiver

pytestmark = pytest.mark.timeout(240)

Factory = Callable[..., Awaitable[RunningServer]]
SECRET = "s3cret-for-tests"
TOPIC = "edge-vision/events"


def scene(seed: int = 0, x: int = 60) -> Scene:
    return text_scene(640, 360, texts=[("LOT42", (x, 120))], font_size=36, seed=seed)


def overrides(rules: list[dict[str, Any]], **sinks: Any) -> dict[str, Any]:
    return {
        "events": {"rules": rules, "sinks": sinks},
        "engine": {"onnxruntime": {"threads": 1}, "warmup_shapes": [(192, 320)]},
        "model": {"input_size": 320},
    }


EVERY = [{"name": "each", "on": "every", "interval_s": 0}]


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    r = await WebhookReceiver(secret=SECRET.encode()).start()
    try:
        yield r
    finally:
        await r.stop()


async def stream(cam: EdgeVisionClient, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await cam.detect(scene(i).jpeg(92), frame_id=i, ts=1000.0 + i)


async def stream_for_events(url: str, n: int, events: int | None = None) -> list[Event]:
    """``n`` frames of one label through a session (every mode); its events as sent on its
    WebSocket, once ``events`` of them came (default ``n``: an every rule's, one a frame)."""
    want = n if events is None else events
    heard: list[Event] = []
    async with camera_client(url, mode="every", on_event=heard.append) as cam:
        await stream(cam, n)

        async def all_heard() -> bool:
            return len(heard) >= want

        await wait_until(all_heard, 10, f"{want} events on the WebSocket")
    return heard


async def xrange(url: str, stream_key: str = "edge-vision:events") -> list[dict[str, Any]]:
    async with aioredis.from_url(url, **driver_info_options()) as raw:
        entries = await raw.xrange(stream_key)
    return [orjson.loads(fields[b"event"]) for _, fields in entries]


async def sink_metrics(srv: RunningServer) -> str:
    async with aiohttp.ClientSession() as http:
        return await metrics_text(http, srv.url)


def counted(text: str, name: str, **labels: str) -> float:
    """A sample of the events' metrics; 0 when the series does not exist yet."""
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as rendered
    try:
        return metric(text, f"edge_vision_events_{name}{{{shown}}}")
    except AssertionError:
        return 0.0


async def test_one_event_reaches_the_websocket_mqtt_redis_and_a_signed_webhook(
    server_factory: Factory,
    broker: Mosquitto,
    redis_server: RedisServer,
    receiver: WebhookReceiver,
) -> None:
    srv = await server_factory(
        overrides(
            [{"name": "lot", "on": "appear"}],
            mqtt={"url": broker.url},
            redis={"url": redis_server.url},
            webhook={"url": receiver.url, "secret": SECRET},
        )
    )
    async with MqttListener(broker) as mqtt:
        (event,) = await stream_for_events(srv.ws_url, 3, events=1)
        await mqtt.wait_for(1, T(10))
        (hook,) = await receiver.wait_for(1, T(10))
        entries, _ = await wait_until(lambda: xrange(redis_server.url), 10, "the stream entry")
    sent = dict(event.raw)
    del sent["type"]  # the WebSocket message's own field; the sinks get the event itself
    (topic, body) = mqtt.messages[0]
    assert topic == f"{TOPIC}/lot" and body == sent
    assert entries == [sent]
    assert hook.body == sent and hook.signature_ok is True
    assert hook.event_id_header == event.event_id
    assert (event.frame_id, event.ts, event.on) == (0, 1000.0, "appear")
    text = await sink_metrics(srv)
    for sink in ("mqtt", "redis", "webhook"):
        assert counted(text, "delivered_total", sink=sink) == 1, sink
        assert counted(text, "queued", sink=sink) == 0, sink


async def test_a_broker_stopped_for_10_s_gets_every_event_once_in_order_when_back(
    server_factory: Factory, broker: Mosquitto
) -> None:
    srv = await server_factory(overrides(EVERY, mqtt={"url": broker.url}))
    async with MqttListener(broker) as mqtt:
        await asyncio.to_thread(broker.stop)
        stopped = time.monotonic()
        heard = await stream_for_events(srv.ws_url, 12)  # events fire while it is down
        text = await sink_metrics(srv)
        assert counted(text, "queued", sink="mqtt") == len(heard)
        await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - stopped)))
        await asyncio.to_thread(broker.start)
        await mqtt.wait_for(len(heard), T(30))
        await asyncio.sleep(0.5)  # anything more (a duplicate) would come by now
    ids = [body["event_id"] for _, body in mqtt.messages]
    assert len(heard) == 12 and ids == [e.event_id for e in heard]  # all, in order, once
    text = await sink_metrics(srv)
    assert counted(text, "retried_total", sink="mqtt") >= 1
    assert counted(text, "delivered_total", sink="mqtt") == 12
    assert counted(text, "queued", sink="mqtt") == 0


async def test_redis_restarted_empty_and_a_webhook_away_get_every_event_when_back(
    server_factory: Factory, redis_server: RedisServer, receiver: WebhookReceiver
) -> None:
    srv = await server_factory(
        overrides(
            EVERY,
            redis={"url": redis_server.url},
            webhook={"url": receiver.url, "secret": SECRET},
        )
    )
    await asyncio.to_thread(redis_server.kill)
    receiver.status = 503  # the receiver answers, but cannot take events now
    heard = await stream_for_events(srv.ws_url, 8)
    await asyncio.sleep(1.0)  # a few retries each
    assert receiver.received == []
    await asyncio.to_thread(redis_server.start)
    receiver.status = 200
    got = await receiver.wait_for(8, T(30))

    async def eight() -> list[dict[str, Any]] | None:
        entries = await xrange(redis_server.url)
        return entries if len(entries) >= 8 else None

    entries, _ = await wait_until(eight, 30, "8 stream entries")
    want = [e.event_id for e in heard]
    assert [r.body["event_id"] for r in got] == want
    assert all(r.signature_ok for r in got)
    assert [e["event_id"] for e in entries] == want
    text = await sink_metrics(srv)
    assert counted(text, "retried_total", sink="redis") >= 1
    assert counted(text, "retried_total", sink="webhook") >= 1


async def test_events_queued_when_the_service_stops_are_delivered_after_it_starts(
    spec: Any, tmp_path: Path
) -> None:
    receiver = WebhookReceiver(secret=SECRET.encode())
    await receiver.start()
    port = receiver.port
    await receiver.stop()  # the receiver is away while the first run raises events
    cfg = overrides(EVERY, webhook={"url": receiver.url, "secret": SECRET})
    cfg["events"]["outbox_dir"] = str(tmp_path / "outbox")
    cfg["server"] = {"shutdown_grace_s": 0.5}
    async with running_server(make_config(cfg), spec) as first:
        heard = await stream_for_events(first.ws_url, 6)
    assert await asyncio.to_thread((tmp_path / "outbox" / "outbox.sqlite").exists)
    await receiver.start(port)
    try:
        async with running_server(make_config(cfg), spec):
            got = await receiver.wait_for(6, T(30))
    finally:
        await receiver.stop()
    assert [r.body["event_id"] for r in got] == [e.event_id for e in heard]


async def test_a_full_outbox_drops_its_oldest_and_a_refused_event_is_counted(
    server_factory: Factory, receiver: WebhookReceiver
) -> None:
    cfg = overrides(EVERY, webhook={"url": receiver.url, "secret": SECRET})
    cfg["events"]["outbox_max"] = 5
    srv = await server_factory(cfg)
    receiver.status = 503
    heard = await stream_for_events(srv.ws_url, 9)
    receiver.refuse = {heard[-1].event_id}  # the newest will be refused for good: 400
    receiver.status = 200
    got = await receiver.wait_for(4, T(30))
    await asyncio.sleep(0.5)
    # The 5 newest waited; of them the last was refused: 4 arrive, in order.
    assert [r.body["event_id"] for r in got] == [e.event_id for e in heard[4:8]]
    text = await sink_metrics(srv)
    assert counted(text, "dropped_total", sink="webhook", reason="outbox_full") == 4
    assert counted(text, "dropped_total", sink="webhook", reason="rejected") == 1


async def test_leave_reaches_the_sinks_when_a_session_ends_and_when_its_camera_is_gone(
    server_factory: Factory, receiver: WebhookReceiver
) -> None:
    srv = await server_factory(
        overrides(
            [{"name": "gone", "on": "leave"}],
            webhook={"url": receiver.url, "secret": SECRET},
        )
    )
    # Ended: the client closes with 1000 while its label is still in view.
    async with camera_client(srv.ws_url, mode="every") as cam:
        await stream(cam, 2)
    (ended,) = await receiver.wait_for(1, T(10))
    assert (ended.body["rule"], ended.body["on"], ended.body["frame_id"]) == ("gone", "leave", 1)
    # Gone: the socket drops (not 1000) and nobody resumes the session.
    cam = camera_client(srv.ws_url, mode="every", resume=False)
    await cam.connect()
    await stream(cam, 2, start=10)
    dropped_at = time.monotonic()
    await cam.close(end_session=False)
    got = await receiver.wait_for(2, T(10))
    waited = time.monotonic() - dropped_at
    assert (got[1].body["on"], got[1].body["frame_id"]) == ("leave", 11)
    assert got[1].body["session"] != ended.body["session"]
    assert waited >= 1.0, waited  # the tracks' keep time: a resume would have kept them


@pytest.mark.timeout(180)
def test_the_events_bench_times_the_rules_and_delivers_every_event(tmp_path: Path) -> None:
    """python -m benchmarks.events, tiny: the rules' cost with and without rules, and every
    event delivered to a real receiver with the outbox in memory and on disk (the bench
    waits for the last one, else it fails)."""
    proc, report = small_bench(
        "events",
        *("--frames", "40", "--labels", "3", "--events", "200", "--rounds", "1"),
        json_out=tmp_path / "events.json",
        timeout=T(150),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [(r["labels"], r["rules"]) for r in report["rules"]] == [(3, 0), (3, 10)]
    assert all(r["median_ms"] > 0 for r in report["rules"])
    assert [r["outbox"] for r in report["delivery"]] == ["memory", "disk"]
    assert all(r["events"] == 200 and r["events_per_s"] > 0 for r in report["delivery"])


async def test_a_rule_with_crop_sends_the_sinks_a_jpeg_of_the_box_within_its_cap(
    server_factory: Factory, receiver: WebhookReceiver
) -> None:
    cfg = overrides(
        [{"name": "lot", "on": "appear", "crop": True}],
        webhook={"url": receiver.url, "secret": SECRET},
    )
    cfg["events"]["crop_max_bytes"] = 4096
    srv = await server_factory(cfg)
    (event,) = await stream_for_events(srv.ws_url, 2, events=1)
    (hook,) = await receiver.wait_for(1, T(10))
    assert "crop" not in event.raw  # the WebSocket's client has the frame
    jpg = base64.b64decode(hook.body["crop"])
    assert jpg[:2] == b"\xff\xd8" and len(jpg) <= 4096
    pixels = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)
    x1, y1, x2, y2 = event.box
    h, w = pixels.shape[:2]
    # The box with a 10 % margin (made smaller only if it did not fit the cap).
    assert w / h == pytest.approx((x2 - x1) / (y2 - y1), rel=0.3)
    assert w <= 1.25 * (x2 - x1) + 2
