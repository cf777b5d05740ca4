"""The systemd notify/watchdog contract, proved against a real notify socket.

systemd is not PID 1 here, so the test owns the AF_UNIX datagram socket systemd would
give a ``Type=notify`` unit (NOTIFY_SOCKET, WATCHDOG_USEC) and runs the real
``edge-vision serve`` as a child, with one worker and with two: READY=1 only after warm-up,
WATCHDOG=1 at WatchdogSec/2, none while one worker's loop is stopped (SIGSTOP), pings
still while the engine is degraded, STOPPING=1 as soon as SIGTERM arrives.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_vision.serve.workers import NodeMonitor, NodeNotifier, WorkerBeat, stale_after_s

from ..support.server import ServerProcess, free_port
from ..support.timing import T

pytestmark = pytest.mark.timeout(180)

WATCHDOG_USEC = 1_000_000  # WatchdogSec=1: pings every 0.5 s
PING_S = WATCHDOG_USEC / 2e6


class NotifySocket:
    """The datagram socket systemd listens on, with every message and when it came."""

    def __init__(self, folder: str) -> None:
        self.path = str(Path(folder) / "notify")  # short: AF_UNIX paths are ~107 bytes
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            with self._lock:
                self.messages.extend((time.monotonic(), m) for m in data.decode().split("\n"))

    def since(self, t: float = 0.0) -> list[tuple[float, str]]:
        with self._lock:
            return [(at, m) for at, m in self.messages if at >= t]

    def pings(self, t: float = 0.0) -> list[float]:
        return [at for at, m in self.since(t) if m == "WATCHDOG=1"]

    def statuses(self, t: float = 0.0) -> list[str]:
        return [m.removeprefix("STATUS=") for _, m in self.since(t) if m.startswith("STATUS=")]

    def wait_for(self, message: Callable[[str], bool], timeout: float) -> float:
        """When the first message for which ``message`` holds arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, m in self.since():
                if message(m):
                    return at
            time.sleep(0.05)
        raise TimeoutError(f"no such message in {timeout:.0f} s; got {self.since()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    with tempfile.TemporaryDirectory(prefix="ev-") as folder:
        sock = NotifySocket(folder)
        try:
            yield sock
        finally:
            sock.close()


def readyz(server: ServerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(server.url + "/readyz", timeout=T(10)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def worker_pids(parent: int) -> list[int]:
    """The parent's worker processes (multiprocessing's spawn children, not its tracker)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"--multiprocessing-fork" in cmdline:
            pids.append(int(stat.parent.name))
    return sorted(pids)


def start_server(sock: NotifySocket, tmp_path: Path, workers: int, *settings: str) -> ServerProcess:
    env = {"NOTIFY_SOCKET": sock.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    server = ServerProcess(
        f"server.workers={workers}",
        *settings,
        port=free_port(),
        env=env,
        log_path=tmp_path / "serve.log",
    )
    return server.start()


def assert_pings_at_the_interval(sock: NotifySocket, seconds: float) -> None:
    t0 = time.monotonic()
    time.sleep(seconds)
    pings = sock.pings(t0)
    assert len(pings) >= seconds / PING_S / 2, f"{len(pings)} pings in {seconds} s"
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert 0.6 * PING_S <= statistics.median(gaps) <= 1.6 * PING_S, gaps


def stop_and_check_stopping(sock: NotifySocket, server: ServerProcess) -> None:
    assert server.proc is not None
    t0 = time.monotonic()
    server.signal(signal.SIGTERM)
    stopping = sock.wait_for(lambda m: m == "STOPPING=1", T(10))
    code = server.proc.wait(T(30))
    exited = time.monotonic()
    assert code == 0, server.log()
    assert t0 <= stopping <= exited  # said while shutting down, not after the fact


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_after_warm_up_pings_while_every_loop_runs_stopping_on_sigterm(
    notify_socket: NotifySocket, tmp_path: Path, workers: int
) -> None:
    sock = notify_socket
    server = start_server(sock, tmp_path, workers)
    assert server.proc is not None
    try:
        ready_at = sock.wait_for(lambda m: m == "READY=1", T(120))
        # READY means warm: the node answers /readyz with 200 from that moment on.
        status, body = readyz(server)
        assert status == 200, body
        before = [m for at, m in sock.since() if at <= ready_at]
        assert "WATCHDOG=1" not in before, before
        assert any(s.startswith("ready: engine onnxruntime") for s in sock.statuses()), (
            sock.statuses()
        )
        assert_pings_at_the_interval(sock, T(3))

        # A wedged event loop in one worker: no more pings.
        victim = server.proc.pid if workers == 1 else worker_pids(server.proc.pid)[-1]
        if workers > 1:
            assert len(worker_pids(server.proc.pid)) == workers
        os.kill(victim, signal.SIGSTOP)
        try:
            time.sleep(stale_after_s(PING_S) + PING_S + T(0.5))
            quiet_from = time.monotonic()
            time.sleep(T(2.5))
            assert sock.pings(quiet_from) == [], "pinged while a worker's loop was stopped"
            if workers > 1:  # the parent still runs and says why in systemctl status
                assert any(s.startswith("unresponsive") for s in sock.statuses(quiet_from - 2))
        finally:
            os.kill(victim, signal.SIGCONT)
        resumed = time.monotonic()
        deadline = resumed + T(10)
        while not sock.pings(resumed) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.pings(resumed), "no pings after the stopped worker went on (SIGCONT)"

        stop_and_check_stopping(sock, server)
    finally:
        server.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_degraded_engine_keeps_the_watchdog_fed_and_says_so(
    notify_socket: NotifySocket, tmp_path: Path, workers: int
) -> None:
    # Triton is down and engine.fallback is none: restarting the node would not bring
    # Triton back, so the node stays up, pings, and says "degraded" to a person and a probe.
    sock = notify_socket
    server = start_server(
        sock,
        tmp_path,
        workers,
        "engine.kind=triton",
        f"engine.triton.url=127.0.0.1:{free_port()}",
        "engine.fallback=none",
    )
    try:
        sock.wait_for(lambda m: m == "READY=1", T(120))
        assert_pings_at_the_interval(sock, T(2))
        statuses = sock.statuses()
        assert any(s.startswith("degraded (engine triton failed to start") for s in statuses), (
            statuses
        )
        status, body = readyz(server)
        assert status == 503 and body["degraded"] is True, body
        stop_and_check_stopping(sock, server)
    finally:
        server.stop()


# -- the decisions, without processes ----------------------------------------------------


def beat(worker: int, **kw: Any) -> WorkerBeat:
    fields: dict[str, Any] = {
        "worker": worker,
        "pid": 100 + worker,
        "started": True,
        "ready": True,
        "engine": "onnxruntime",
        "problem": None,
        "clients": 1,
        "answered": 0.0,
    }
    return WorkerBeat(**{**fields, **kw})


def test_node_monitor_status_lines_a_person_reads() -> None:
    m = NodeMonitor(2, stale_after=1.0)
    m.record(beat(0, started=False, ready=False), now=0.0)
    assert m.status_line(0.0) == "starting: engine warming up (0 of 2 workers started)"
    assert not m.all_started()
    m.record(beat(0, answered=10), now=1.0)
    m.record(beat(1, answered=20, clients=2), now=1.0)
    assert m.all_started() and m.alive(1.5)
    m.update_fps(1.0)
    m.record(beat(0, answered=40), now=2.0)
    m.record(beat(1, answered=50, clients=2), now=2.0)
    assert m.update_fps(2.0) == pytest.approx(60.0)
    assert m.status_line(2.0) == "ready: engine onnxruntime, 3 clients, 60.0 fps"
    m.record(beat(1, problem="triton failed to start: unreachable"), now=2.5)
    assert m.status_line(2.5).startswith("degraded (triton failed to start: unreachable)")
    assert m.stale(3.4) == [0] and not m.alive(3.4)
    assert m.status_line(3.4).startswith("unresponsive: worker 0 sent no beat")


def test_node_notifier_sends_ready_once_pings_only_while_alive_and_stopping_once() -> None:
    sent: list[str] = []
    n = NodeNotifier(2, watchdog_s=1.0, notify=sent.append)  # stale after 1.5 s
    n.record(beat(0), now=0.0)
    n.tick(0.0)
    assert "READY=1" not in sent  # worker 1 has not started yet
    n.record(beat(1), now=0.5)
    n.tick(0.5)
    assert sent[-3:-1] == ["STATUS=ready: engine onnxruntime, 2 clients, 0.0 fps", "READY=1"]
    assert sent[-1] == "WATCHDOG=1"  # the first ping comes with READY, the next 1 s later
    n.tick(0.6)
    assert sent.count("WATCHDOG=1") == 1
    n.record(beat(1), now=1.5)
    n.tick(1.7)  # worker 0's beat is 1.7 s old: stale, no ping; the status says so
    assert sent.count("WATCHDOG=1") == 1
    assert sent[-1].startswith("STATUS=unresponsive: worker 0")
    n.record(beat(0), now=2.4)
    n.tick(2.5)
    assert sent.count("WATCHDOG=1") == 2 and sent.count("READY=1") == 1
    n.relayed_status(2.6)  # a worker's plan-build progress stays up while nothing changes
    before = len(sent)
    n.tick(2.7)
    assert not [m for m in sent[before:] if m.startswith("STATUS=")]
    n.stop()
    n.stop()
    assert sent.count("STOPPING=1") == 1
    n.tick(5.0)
    assert sent[-1].startswith("STATUS=stopping")  # no pings after STOPPING=1
