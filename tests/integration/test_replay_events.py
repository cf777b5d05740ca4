"""``edge-vision replay --events``: the config's rules over a recorded video (docs/events.md,
"Replay: the events of a recorded video").

Real parts: a clip written with OpenCV whose label moves across known positions
(tests/support/video.py), the embedded model in process, the rules of ``events.rules``
from a config file, and for the sinks a real redis-server and a real mosquitto with a
subscriber. Checked: every event of the clip in the JSONL, with the live event's fields,
the frames' own timestamps from the video and the rules run on the video's own clock
(the same events in a second run, only the ids and ``at`` new); the same events in the
Redis stream and on MQTT as in the file, and the summary's counts; a sink that is down
waited for, bounded, then counted; a bad ``--events`` path refused in one line.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from redis import asyncio as aioredis

from edge_vision.common.redis_client import driver_info_options
from edge_vision.tools import replay

from ..support.mosquitto import Mosquitto, MqttListener
from ..support.redis_server import RedisServer
from ..support.server import RunningServer, free_port
from ..support.timing import T
from ..support.video import TextClip, write_text_clip

pytestmark = pytest.mark.timeout(240)

#: The label moves left to right across the clip: in the right half's zone from about the
#: middle on (its anchor, the box's bottom centre, passes x = 0.5).
RULES: dict[str, Any] = {
    "zones": {"right": [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]]},
    "rules": [
        {"name": "seen", "on": "appear"},
        {"name": "in-right", "on": "appear", "zone": "right"},
        {"name": "each", "on": "every", "interval_s": 0.5},
        {"name": "gone", "on": "leave"},
    ],
}
RULES_ORDER = [r["name"] for r in RULES["rules"]]
FIELDS = {
    "event_id", "rule", "on", "node", "session", "frame_id", "ts", "at", "track", "class",
    "label", "score", "box", "text", "zone", "zones",
}  # fmt: skip


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> TextClip:
    """2 s at 15 fps: one label, found on (nearly) every frame."""
    folder = tmp_path_factory.mktemp("replay-events")
    return write_text_clip(folder / "line.mp4", 640, 360, frames=30, fps=15.0)


def config_file(folder: Path, events: dict[str, Any]) -> Path:
    path = folder / "edge-vision.yaml"
    path.write_text(yaml.safe_dump({"events": events}))
    return path


def run_with_events(
    folder: Path, clip: TextClip, events: dict[str, Any], *args: str, name: str = "run"
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """``python -m edge_vision.tools.replay CLIP --config … --events …`` in this process:
    the exit code, the events written, the summary."""
    out, summary = folder / f"{name}.events.jsonl", folder / f"{name}.summary.json"
    code = replay.main(
        [
            str(clip.path),
            *("--config", str(config_file(folder, events))),
            *("--events", str(out), "--summary-json", str(summary), "--no-progress"),
            *args,
        ]
    )
    written = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return code, written, orjson.loads(summary.read_bytes())


def what_happened(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """An event without what is new each run (its id, ``at``, the session)."""
    return [(e["rule"], e["on"], e["frame_id"], e["ts"], e["track"], e["box"]) for e in events]


def test_the_rules_events_of_a_clip_are_written_with_the_videos_time(
    clip: TextClip, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, events, summary = run_with_events(tmp_path, clip, RULES)
    assert code == 0
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_rule.setdefault(e["rule"], []).append(e)
        assert set(e) == FIELDS, e  # the live event's fields (no crop, no line, no dwell_s)
        assert re.fullmatch(r"[0-9a-f]{32}", e["event_id"])
        # ts is the frame's own time in the video (ms), frame_id its number.
        assert e["ts"] == pytest.approx(clip.ts(e["frame_id"]))
        assert e["label"] == "text" and e["class"] == 0 and 0 < e["score"] <= 1
        assert e["at"] == pytest.approx(time.time(), abs=60)  # this machine's clock
    assert len({e["event_id"] for e in events}) == len(events)
    assert len({e["session"] for e in events}) == 1 and len({e["node"] for e in events}) == 1
    # One label, one track: appear once, at the first frame; leave once, as the video ends,
    # carrying the last frame the label was seen in.
    (seen,) = by_rule["seen"]
    (gone,) = by_rule["gone"]
    assert seen["frame_id"] == 0 and seen["ts"] == 0.0 and seen["zone"] is None
    assert gone["on"] == "leave" and gone["frame_id"] >= clip.frames - 2
    assert {e["track"] for e in events} == {seen["track"]}
    # In the right half's zone: once, where the box's bottom centre passed the middle.
    (right,) = by_rule["in-right"]
    x1, _, x2, _ = right["box"]
    assert (x1 + x2) / 2 >= clip.width / 2 and right["zone"] == "right"
    assert right["zones"] == ["right"] and seen["zones"] == []
    # every 0.5 s of the video's time, not of this machine's (which answers faster or
    # slower than 15 fps): each one the first frame 0.5 s or more after the last.
    each = [e["ts"] for e in by_rule["each"]]
    assert each[0] == 0.0 and len(each) >= 3
    assert all(500 <= b - a < 500 + 2 * 1000 / clip.fps for a, b in itertools.pairwise(each))
    # The summary counts them per rule; stdout says so.
    assert summary["events"]["rules"] == {r: len(by_rule.get(r, [])) for r in RULES_ORDER}
    assert summary["events"]["total"] == len(events) and summary["events"]["sinks"] == {}
    out = capsys.readouterr().out
    assert f"events {len(events)}: seen 1, in-right 1, each {len(each)}, gone 1" in out
    # The same clip again: the same events (the video's clock), with new ids.
    code2, again, _ = run_with_events(tmp_path, clip, RULES, name="again")
    assert code2 == 0 and what_happened(again) == what_happened(events)
    assert not {e["event_id"] for e in again} & {e["event_id"] for e in events}


async def test_against_a_running_server_the_same_events_come_from_its_results(
    clip: TextClip, tmp_path: Path, server: RunningServer
) -> None:
    """``--url``: the rules run over the results the server sends back (the server has
    none of its own here): the same events as in process."""
    code, remote, summary = await asyncio.to_thread(
        run_with_events, tmp_path, clip, RULES, "--url", server.ws_url, name="remote"
    )
    code2, local, _ = await asyncio.to_thread(run_with_events, tmp_path, clip, RULES)
    assert code == code2 == 0 and summary["target"].startswith(server.ws_url)

    def outline(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e["rule"], e["frame_id"], e["ts"], e["track"]) for e in events]

    assert outline(remote) == outline(local) and remote
    assert all(set(e) == FIELDS for e in remote)


async def test_the_events_reach_a_redis_stream_and_mqtt_as_written(
    clip: TextClip, tmp_path: Path, redis_server: RedisServer, broker: Mosquitto
) -> None:
    events_cfg = {
        **RULES,
        "sinks": {"redis": {"url": redis_server.url}, "mqtt": {"url": broker.url}},
    }
    async with MqttListener(broker) as mqtt:
        code, events, summary = await asyncio.to_thread(run_with_events, tmp_path, clip, events_cfg)
        assert code == 0 and len(events) >= 6
        # Delivered before replay ended (it waits for the outboxes): all in the stream now.
        async with aioredis.from_url(redis_server.url, **driver_info_options()) as raw:
            entries = await raw.xrange("edge-vision:events")
        assert [orjson.loads(fields[b"event"]) for _, fields in entries] == events
        assert [fields[b"event_id"].decode() for _, fields in entries] == [
            e["event_id"] for e in events
        ]
        await mqtt.wait_for(len(events), T(10))
    # MQTT: each event once, on its rule's topic; in order within a topic.
    assert sorted(mqtt.messages, key=lambda m: m[1]["event_id"]) == sorted(
        ((f"edge-vision/events/{e['rule']}", e) for e in events), key=lambda m: m[1]["event_id"]
    )
    for rule in RULES_ORDER:
        heard = [b["event_id"] for t, b in mqtt.messages if t.endswith(f"/{rule}")]
        assert heard == [e["event_id"] for e in events if e["rule"] == rule]
    n = len(events)
    assert summary["events"]["sinks"] == {
        "mqtt": {"delivered": n, "dropped": 0, "undelivered": 0},
        "redis": {"delivered": n, "dropped": 0, "undelivered": 0},
    }
    assert Counter(e["rule"] for e in events) == Counter(
        {r: k for r, k in summary["events"]["rules"].items() if k}
    )


def test_a_sink_that_is_down_is_waited_for_then_its_events_counted_undelivered(
    clip: TextClip, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}"
    events_cfg = {**RULES, "sinks": {"redis": {"url": nobody}}}
    started = time.monotonic()
    code, events, summary = run_with_events(
        tmp_path, clip, events_cfg, "--events-drain-timeout", "1.5"
    )
    waited = time.monotonic() - started
    assert code == 0 and events  # the file has them all; the sink has none
    assert summary["events"]["sinks"] == {
        "redis": {"delivered": 0, "dropped": 0, "undelivered": len(events)}
    }
    captured = capsys.readouterr()
    assert f"{len(events)} events waiting for the sinks (redis {len(events)})" in captured.err
    assert f"to redis: 0 delivered, 0 dropped, {len(events)} undelivered" in captured.out
    assert waited < T(60)


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_a_bad_events_path_is_refused_in_one_line(
    clip: TextClip, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    path = tmp_path / "nope" / "events.jsonl" if where == "missing folder" else tmp_path
    code = replay.main([str(clip.path), "--events", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    said = "folder" if where == "missing folder" else "is a folder"
    assert err.startswith(f"edge-vision replay: --events {path}: ") and said in err, err
