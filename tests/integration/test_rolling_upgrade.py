"""A rolling upgrade for real (docs/protocol.md, "Upgrading a cluster node by node").

A node of the release before protocol versions (commit PREVIOUS_RELEASE, unpacked from
this repository's history with `git archive`, run as its own `edge-vision serve`) and a
node of this tree share one real redis-server. A session started on the old node and
stopped there with SIGTERM resumes on the new node, for a protocol 1 and a protocol 2
client, with its settings and counters. The other way round the old release cannot read
the new session records (they keep only the resume token's hash), so the client gets a
new session: the documented limit of the mixed period.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_vision import errors
from edge_vision.tools.bench.servers import stop_process

from ..support.clients import camera_client
from ..support.cluster import LIGHT_NODE, REPO
from ..support.images import text_scene
from ..support.redis_server import RedisServer
from ..support.server import ServerProcess, free_port
from ..support.timing import T

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

#: The last commit before protocol 2: protocol 1 only, session records with the token.
PREVIOUS_RELEASE = "4cb7138"
SCENE = text_scene(320, 240, texts=[("LOT 42", (40, 100))], font_size=40)
JPG = SCENE.jpeg()


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's package, unpacked (no checkout, nothing written to .git)."""
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"this clone lacks the history back to {PREVIOUS_RELEASE} (shallow?)")
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE, "edge_vision", "web"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


class OldNode:
    """`python -m edge_vision serve` of the previous release (its own cwd and sys.path)."""

    def __init__(self, tree: Path, node_id: str, redis_url: str, log: Path) -> None:
        self.port = free_port()
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        args = [sys.executable, "-m", "edge_vision", "serve", "--host", "127.0.0.1"]
        args += ["--port", str(self.port)]
        for a in (f"state.redis_url={redis_url}", f"state.node_id={node_id}", *LIGHT_NODE):
            args += ["--set", a]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                args, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=out, stderr=out
            )

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, T(15))


@pytest.fixture
def nodes(
    previous_release: Path, redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[OldNode, ServerProcess]]:
    old = OldNode(previous_release, "old", redis_server.url, tmp_path / "old.log")
    new = ServerProcess(
        f"state.redis_url={redis_server.url}",
        "state.node_id=new",
        *LIGHT_NODE,
        log_path=tmp_path / "new.log",
    ).start()
    try:
        yield old, new
    finally:
        old.stop()
        new.stop()


async def stream_then_stop(url: str, protocol: int, stop: object) -> tuple[str, str, int]:
    """Open a session, set a confidence, get 3 answers, SIGTERM the node: the server says
    shutting down. Returns (session id, resume token, protocol the node spoke)."""
    client = camera_client(url, protocol=protocol, mode="every", retry_s=T(60), resume=False)
    await client.connect()
    try:
        await client.settings(confidence=0.33)
        for i in range(3):
            assert (await client.detect(JPG, frame_id=i)).detections
        hello = client.hello
        await asyncio.to_thread(stop)  # type: ignore[arg-type]
        with pytest.raises(errors.ServerShuttingDown):
            async for _ in client.results():
                pass
    finally:
        await client.close()
    return hello.session_id, hello.resume_token, hello.protocol


@pytest.mark.parametrize("protocol", [1, 2])
async def test_a_session_of_the_old_release_resumes_on_the_new(
    nodes: tuple[OldNode, ServerProcess], protocol: int
) -> None:
    old, new = nodes
    session_id, token, spoken = await stream_then_stop(old.ws_url, protocol, old.stop)
    assert spoken == 1  # the old release speaks 1, whatever the client asked for
    await new.wait_ready()
    async with camera_client(new.ws_url, protocol=protocol, resume_token=token) as client:
        hello = client.hello
        assert (await client.detect(JPG, frame_id=10)).id == 10
    assert hello.protocol == protocol and hello.resumed and hello.session_id == session_id
    assert hello.settings.confidence == 0.33 and hello.counters.answered == 3


async def test_a_session_of_the_new_release_starts_anew_on_the_old(
    nodes: tuple[OldNode, ServerProcess],
) -> None:
    old, new = nodes
    await new.wait_ready()
    session_id, token, _ = await stream_then_stop(new.ws_url, 1, new.stop)
    async with camera_client(old.ws_url, protocol=1, resume_token=token) as client:
        hello = client.hello
        assert (await client.detect(JPG, frame_id=10)).id == 10  # it streams, afresh
    assert hello.protocol == 1 and not hello.resumed and hello.session_id != session_id
