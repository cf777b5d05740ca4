"""The JavaScript client (edge_vision/web/client/, docs/js-client.md) in headless Chromium
against the real service and model: frames drawn on a canvas are answered by id, frames that
latest-wins replaced are settled as dropped and counted as the server counts them, a frame
over the node's limit is refused before it is sent, a wrong path and a dead port are named,
a session survives a server restart (its `closing`, or a crash) through Redis, and each
close reason arrives as its own error class.

The client is imported from the node itself (/static/client/index.js) by a page of the
node's own origin, as a web developer's page would.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from ..support.browser import SERVER_DOWN_NOISE, LoggedServerProcess, PageOpener
from ..support.server import ServerProcess, free_port
from ..support.timing import T

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# In the page: the client as `ev`, and `scene(text)`: a canvas with one dark line of text.
SETUP = """async () => {
  window.ev = await import('/static/client/index.js');
  window.scene = (text, x = 80, y = 200) => {
    const c = document.createElement('canvas');
    c.width = 640; c.height = 360;
    const g = c.getContext('2d');
    g.fillStyle = '#e9e4d6'; g.fillRect(0, 0, 640, 360);
    g.fillStyle = '#161616'; g.font = 'bold 56px sans-serif';
    g.fillText(text, x, y);
    const m = g.measureText(text);
    c.textBox = [x - m.actualBoundingBoxLeft, y - m.actualBoundingBoxAscent,
                 x + m.actualBoundingBoxRight, y + m.actualBoundingBoxDescent];
    return c;
  };
  window.wsUrl = `ws://${location.host}/ws`;
}"""

# Chromium's own log lines for a socket refused with a page (the wrong path) or a dead port,
# and for the client's plain GET of a path that serves nothing (404), which says why.
WRONG_PATH_NOISE = (
    re.compile(r"^WebSocket connection to 'ws://127\.0\.0\.1:\d+/[^']*' failed"),
    re.compile(r"^Failed to load resource: the server responded with a status of 404"),
)


def client_page(open_page: PageOpener, server: ServerProcess) -> tuple[Page, Any]:
    page, console = open_page(server.url + "/healthz", no_favicon=True)
    page.evaluate(SETUP)
    return page, console


def iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def test_canvas_frames_are_answered_by_id_and_drops_are_counted(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = client_page(open_page, page_server)
    got = page.evaluate(
        """async () => {
          const drops = [];
          const onDrop = (id, cause) => drops.push([id, cause]);
          const c = new ev.EdgeVisionClient(wsUrl, {onDrop});
          const hello = await c.connect();
          const canvas = scene('LOT 4711');
          const first = await c.detect(canvas);
          // Eight frames back to back, with ids of our own, while the engine is busy:
          // latest-wins answers the newest and drops some of those before it.
          const sent = [];
          for (const id of ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']) {
            sent.push(await c.send(canvas, {id}));
          }
          const outcomes = await Promise.allSettled(sent.map((s) => s.result));
          const blob = await new Promise((r) => canvas.toBlob(r, 'image/jpeg', 0.9));
          const fromBlob = await c.detect(blob, {wire: 'json'});
          const fromBytes = await c.detect(new Uint8Array(await blob.arrayBuffer()));
          let tooBig = null;
          try {
            await c.send(new Uint8Array(hello.limits.max_message_bytes + 1));
          } catch (e) {
            tooBig = {name: e.name, size: e.size, limit: e.limit, code: e.code,
                      typed: e instanceof ev.MessageTooBig && e instanceof ev.ConnectionClosed};
          }
          const last = await c.detect(canvas); // the connection stays open
          const books = {...c.books, pending: c.books.pending};
          await c.close();
          const answered = [];
          for await (const a of c.results()) answered.push(a.id);
          return {
            protocol: hello.protocol, textBox: canvas.textBox,
            first: {id: first.id, boxes: first.detections.map((d) => d.box),
                    track: first.detections[0]?.track, width: first.width},
            outcomes: outcomes.map((o, i) => ({id: sent[i].id, ok: o.status === 'fulfilled',
              error: o.reason?.name, cause: o.reason?.dropCause,
              resultId: o.value?.id})),
            drops, fromBlob: fromBlob.detections.length, fromBytes: fromBytes.detections.length,
            tooBig, lastDropped: last.dropped, books, answered, state: c.state.kind,
            ended: c.state.error?.name,
          };
        }"""
    )
    console.assert_clean()
    assert got["protocol"] == 3
    assert got["first"]["id"] == 0 and got["first"]["width"] == 640
    assert any(iou(box, got["textBox"]) >= 0.4 for box in got["first"]["boxes"]), got
    assert isinstance(got["first"]["track"], int)
    outcomes = got["outcomes"]
    assert outcomes[-1]["ok"], "the last frame sent is always answered"
    for o in outcomes:  # each promise got its own frame's answer, or was dropped
        assert (o["ok"] and o["resultId"] == o["id"]) or (
            o["error"] == "FrameDropped" and o["cause"] == "latest"
        ), o
    dropped = [o["id"] for o in outcomes if not o["ok"]]
    assert dropped, "eight frames back to back and none replaced: latest-wins never acted"
    assert got["drops"] == [[i, "latest"] for i in dropped]
    assert got["fromBlob"] >= 1 and got["fromBytes"] >= 1
    limit = got["tooBig"]["limit"]
    assert got["tooBig"] == {
        "name": "MessageTooBig",
        "size": limit + 1,
        "limit": limit,
        "code": None,
        "typed": True,
    }
    books = got["books"]
    assert books["sent"] == 12 and books["pending"] == 0 and books["lost"] == 0
    assert books["dropped"] == len(dropped)
    assert books["answered"] + books["dropped"] == books["sent"]
    assert got["lastDropped"] == books["dropped"], "the server counted other drops than we did"
    answered_ids = [0, *[o["id"] for o in outcomes if o["ok"]], 1, 2, 3]  # own ids aside
    assert got["answered"] == answered_ids, "results() in another order than sent"
    assert (got["state"], got["ended"]) == ("closed", "SessionEnded")


def test_a_wrong_path_and_a_dead_port_are_named(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    page, console = client_page(open_page, page_server)
    dead = f"ws://127.0.0.1:{free_port()}/ws"
    with console.expect_server_down((*SERVER_DOWN_NOISE, *WRONG_PATH_NOISE)):
        got = page.evaluate(
            """async (dead) => {
              const failure = async (url, options) => {
                const states = [];
                const onState = (s) => states.push(s.kind);
                const c = new ev.EdgeVisionClient(url, {...options, onState});
                try { await c.connect(); return {connected: true}; }
                catch (e) {
                  return {name: e.name, message: e.message, wsUrl: e.wsUrl ?? null,
                          status: e.status ?? null, retries: c.retries, states,
                          typed: e instanceof ev.ConnectFailed};
                }
              };
              return {
                page: await failure(`ws://${location.host}/`, {retryMs: 5000}),
                other: await failure(`ws://${location.host}/api/socket`, {retryMs: 5000}),
                dead: await failure(dead, {retryMs: 1500, backoffFirstMs: 100}),
              };
            }""",
            dead,
        )
    page_url = page_server.url.replace("http:", "ws:")
    assert got["page"]["name"] == "WrongPath" and got["page"]["typed"]
    assert got["page"]["message"] == (
        f"{page_url}/ is the overlay page; the WebSocket is at {page_url}/ws"
    )
    assert got["page"]["wsUrl"] == f"{page_url}/ws" and got["page"]["retries"] == 0
    assert got["other"]["name"] == "WrongPath" and got["other"]["status"] == 404
    assert f"it is at {page_url}/ws" in got["other"]["message"]
    assert "<" not in got["page"]["message"] + got["other"]["message"], "HTML in the message"
    assert got["dead"]["name"] == "ServerUnreachable" and got["dead"]["retries"] >= 1
    assert "waiting" in got["dead"]["states"], "it retried without saying so"
    assert "tried for" in got["dead"]["message"] and "edge-vision serve" in got["dead"]["message"]
    console.assert_clean()


def test_close_reasons_arrive_as_their_own_errors(
    page_server: ServerProcess, open_page: PageOpener
) -> None:
    """Another connection resumes this session (another tab): the first learns it as
    SessionSuperseded (4000), which is not resumed; results() and send() raise it."""
    page, console = client_page(open_page, page_server)
    got = page.evaluate(
        """async () => {
          const first = new ev.EdgeVisionClient(wsUrl);
          const hello = await first.connect();
          const canvas = scene('BAY 12');
          await first.detect(canvas);
          const ended = new Promise((resolve) => {
            (async () => { try { for await (const _ of first.results()) {} resolve(null); }
                           catch (e) { resolve(e); } })();
          });
          const second = new ev.EdgeVisionClient(wsUrl, {resumeToken: hello.resume_token});
          const taken = await second.connect();
          const error = await ended;
          let sendError = null;
          try { await first.send(canvas); } catch (e) { sendError = e.name; }
          const stillServes = (await second.detect(canvas)).detections.length;
          await second.close();
          return {
            name: error?.name, code: error?.code, resumable: error?.resumable,
            typed: error instanceof ev.SessionSuperseded && error instanceof ev.ConnectionClosed,
            state: first.state.kind, stateError: first.state.error?.name, sendError,
            sameSession: taken.session_id === hello.session_id, resumed: taken.resumed,
            stillServes, resumes: first.resumes,
          };
        }"""
    )
    assert got == {
        "name": "SessionSuperseded",
        "code": 4000,
        "resumable": False,
        "typed": True,
        "state": "closed",
        "stateError": "SessionSuperseded",
        "sendError": "SessionSuperseded",
        "sameSession": True,
        "resumed": True,
        "stillServes": got["stillServes"],
        "resumes": 0,
    }
    assert got["stillServes"] >= 1
    console.assert_clean()


@pytest.fixture
def redis_node(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[list[LoggedServerProcess], str]]:
    """A node keeping its sessions in a real redis-server; the list holds the one running
    (a test that restarts it puts the new one there, to be stopped at the end)."""
    redis_url = request.getfixturevalue("redis_server").url
    server = LoggedServerProcess(f"state.redis_url={redis_url}", log_path=tmp_path / "a.log")
    running = [server.start()]
    try:
        server.wait_ready_blocking()
        yield running, redis_url
    finally:
        running[-1].stop()


@pytest.mark.redis
@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGKILL], ids=["closing", "crash"])
def test_the_session_is_resumed_across_a_server_restart(
    stop_with: signal.Signals,
    redis_node: tuple[list[LoggedServerProcess], str],
    open_page: PageOpener,
    tmp_path: Path,
) -> None:
    """SIGTERM: the node says `closing` with the resume token, then 1001; SIGKILL: the
    socket just ends. Either way the client resumes the session on the restarted node by
    itself (same id, its settings kept), and a client told not to resume learns why it
    ended: ServerShuttingDown with the token, or ConnectionLost."""
    running, redis_url = redis_node
    server = running[0]
    page, console = client_page(open_page, server)
    before = page.evaluate(
        """async () => {
          window.states = [];
          window.c = new ev.EdgeVisionClient(wsUrl, {onState: (s) => states.push(s.kind)});
          window.once = new ev.EdgeVisionClient(wsUrl, {resume: false});
          const hello = await c.connect();
          await once.connect();
          await c.settings({confidence: 0.3});
          window.canvas = scene('GATE 7');
          const r = await c.detect(canvas);
          return {session: hello.session_id, boxes: r.detections.length};
        }"""
    )
    assert before["boxes"] >= 1
    with console.expect_server_down():
        server.signal(stop_with)
        assert server.proc is not None
        server.proc.wait(T(20))
        page.wait_for_function("c.state.kind !== 'open' && once.state.kind === 'closed'")
        ended = page.evaluate(
            """() => { const e = once.state.error;
                       return {name: e.name, code: e.code, resumable: e.resumable,
                               token: e.resumeToken ?? null}; }"""
        )
        restarted = LoggedServerProcess(
            f"state.redis_url={redis_url}", port=server.port, log_path=tmp_path / "b.log"
        ).start()
        running.append(restarted)
        restarted.wait_ready_blocking()
        page.wait_for_function("c.isOpen && c.resumes === 1", timeout=T(40) * 1000)
    after = page.evaluate(
        """async () => {
          const r = await c.detect(canvas);
          return {session: c.hello.session_id, resumed: c.hello.resumed,
                  confidence: c.hello.settings.confidence, boxes: r.detections.length,
                  states, books: {...c.books, pending: c.books.pending}};
        }"""
    )
    if stop_with == signal.SIGTERM:
        assert ended["name"] == "ServerShuttingDown" and ended["code"] == 1001
        assert ended["token"], "closing carried no resume token"
    else:
        assert ended["name"] == "ConnectionLost"
    assert ended["resumable"] is True
    assert after["session"] == before["session"] and after["resumed"] is True
    assert after["confidence"] == 0.3, "the session's settings were not kept"
    assert after["boxes"] >= 1
    assert "waiting" in after["states"] and after["states"][-1] == "open"
    assert after["books"]["pending"] == 0
    console.assert_clean()
    open_page.close_all()
