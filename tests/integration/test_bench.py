"""A short smoke run of the benchmark command (real server, camera processes, baseline)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_vision.common.aio import with_timeout
from edge_vision.tools.bench.command import _ratios
from edge_vision.tools.bench.load import CameraPlan, run_camera

from ..support.lab import small_bench
from ..support.timing import T


def bench(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_vision",
            "bench",
            "--out",
            str(out),
            "--frames",
            "8",
            "--resolution",
            "640x360",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=T(240),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict = json.loads((out / "results.json").read_text())  # type: ignore[type-arg]
    result["_stdout"] = proc.stdout
    result["_files"] = sorted(p.name for p in out.iterdir())
    return result


@pytest.mark.timeout(300)
def test_bench_compares_ours_with_the_engine_ceiling_and_the_baseline(tmp_path: Path) -> None:
    r = bench(
        tmp_path,
        "--compare",
        "--cameras",
        "2",
        "--fps",
        "4",
        "--duration",
        "4",
        "--engine-seconds",
        "0.5",
    )
    runs = {run["name"]: run for run in r["runs"]}
    ours, base = runs["edge_vision"], runs["baseline"]
    for run in (ours, base):
        assert run["sent"] == 2 * 4 * 4 and run["errors"] == 0 and run["duplicates"] == 0
        assert run["answered"] + run["dropped"] == run["sent"]
        assert run["latency_ms"]["p50"] > 0
    assert ours["server_stages_ms"]["infer_ms"]["p50"] > 0
    # Where the server's CPU went, by thread role (edge_vision/common/threads.py): the ONNX
    # Runtime threads did the inference, the event loop the WebSocket; together the
    # roles account for the server's CPU.
    roles = ours["server_cpu_by_thread_s"]
    assert roles["ort"] > 0 and roles["loop"] > 0, roles
    assert sum(roles.values()) == pytest.approx(ours["server_cpu_s"], abs=0.3), roles
    assert max(roles, key=roles.__getitem__) == "ort", roles
    assert 0 < ours["host_cpu_share"]["busy"] <= 1 and ours["host_cpu_share"]["cores"] >= 1
    assert "by thread: ort" in r["_stdout"] and "cores busy" in r["_stdout"]
    assert r["engine_only"]["rows"][0]["serial"]["frames_per_s"] > 0
    assert "engine ceiling" in r["_stdout"] and "baseline p99" in r["_stdout"]
    # The push: the most cameras that stayed >= 95 % answered, as a share of the ceiling
    # of this same run. Two polite cameras are usually answered in full here; in a loaded
    # full test run a few of their frames were once superseded by later ones (latest-wins,
    # counted as dropped), and then no count holds. The rule itself: the test below.
    ceiling = max(row["pipelined"]["frames_per_s"] for row in r["engine_only"]["rows"])
    if ours["answered"] >= 0.95 * ours["sent"]:
        push = r["ratios"]["push"]
        assert push["cameras"] == 2 and "push: 2 cameras" in r["_stdout"]
        assert push["fraction_of_ceiling"] == pytest.approx(ours["answered_per_s"] / ceiling)
    else:
        assert "push" not in r["ratios"] and "push:" not in r["_stdout"]
    assert {"results.json", "latency_cdf.png", "throughput_p99_vs_cameras.png"} <= set(r["_files"])


def test_the_push_is_the_most_cameras_still_answered_95_percent_as_a_share_of_the_ceiling() -> None:
    """The push toward the engine (issue 11): of a sweep, the largest camera count whose
    answered frames stayed >= 95 % of those sent, and its answered rate over the ceiling
    measured in the same run; the baseline's runs do not count."""

    def run(name: str, cameras: int, sent: int, answered: int) -> dict[str, Any]:
        return {
            "name": name,
            "cameras": cameras,
            "sent": sent,
            "answered": answered,
            "answered_per_s": answered / 10,
            "latency_ms": {"p99": 20.0},
            "p99_by_third_ms": [20.0, 20.0, 20.0],
        }

    engine = {
        "rows": [
            {"serial": {"batch_ms": {"p50": 5.0}}, "pipelined": {"frames_per_s": 400.0}},
            {"serial": {"batch_ms": {"p50": 8.0}}, "pipelined": {"frames_per_s": 500.0}},
        ]
    }
    runs = [
        run("edge_vision", 8, 2400, 2400),
        run("edge_vision", 16, 4800, 4560),  # exactly 95 %: holds
        run("edge_vision", 32, 9600, 9000),  # 93.75 %: does not
        run("baseline", 64, 19200, 19200),  # not ours
    ]
    push = _ratios(runs, engine)["push"]
    assert push["cameras"] == 16
    assert push["fraction_of_ceiling"] == pytest.approx(456 / 500)
    assert "push" not in _ratios([run("edge_vision", 8, 2400, 2000)], engine)


async def test_a_camera_against_a_server_that_stops_reading_reports_the_stall() -> None:
    """A server that sends hello and never reads again (a synchronous baseline busy with its
    backlog does this): the camera does not hang past its run and drain time, says it could
    not send on schedule, and counts as sent only the frames it wrote."""
    stop = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        key = next(
            ln.split(":", 1)[1].strip()
            for ln in head.split("\r\n")
            if ln.lower().startswith("sec-websocket-key")
        )
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        ).decode()
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
        )
        hello = json.dumps(  # a hello with the fields the protocol requires
            {"type": "hello", "session_id": "s", "resume_token": "r",
             "settings": {"mode": "latest", "confidence": 0.5}}
        ).encode()  # fmt: skip
        writer.write(bytes([0x81, len(hello)]) + hello)  # one unmasked text frame
        await writer.drain()
        await stop.wait()  # and never read again
        writer.close()

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(handle, sock=sock)
    port = sock.getsockname()[1]
    frame = bytes(1_000_000)  # 30 MB offered in the run: far beyond the socket buffers
    plan = CameraPlan(0, f"ws://127.0.0.1:{port}/ws", [frame], fps=30, duration_s=1.0, drain_s=1.0)
    try:
        res = await with_timeout(run_camera(plan, None), T(30))
    finally:
        stop.set()
        server.close()
    assert res.send_stalled and res.connect_error is None
    assert 0 < res.sent < 30 and res.answered == 0
    assert res.unanswered == res.sent  # reported, not silently lost


@pytest.mark.timeout(180)
def test_the_loop_bench_times_the_server_s_cpu_a_message_on_each_loop(tmp_path: Path) -> None:
    """python -m benchmarks.loop, tiny: a real server per loop, every message echoed
    and counted, the server's CPU per message read from /proc for both loops."""
    proc, report = small_bench(
        "loop",
        # enough messages that the server's CPU time is many of /proc's 10 ms ticks
        *("--clients", "4", "--messages", "250", "--bytes", "90000", "--rounds", "1"),
        json_out=tmp_path / "loop.json",
        timeout=T(150),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [r["loop"] for r in report["runs"]] == ["asyncio", "uvloop"]
    for r in report["runs"]:
        assert r["messages"] == 4 * 250
        assert r["server_cpu_us_per_message"] > 0 and r["messages_per_s"] > 0
    assert "µs server CPU a message" in proc.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["slots", "ring"])
def test_the_handoff_bench_passes_every_frame_through_shared_memory_and_times_both_sides(
    tmp_path: Path, transport: str
) -> None:
    """python -m benchmarks.handoff, tiny: every frame's reply comes back from the
    other process (the bench fails on a reply that is not its frame's), and both sides'
    CPU a frame is reported for each batch size; ``ring``: through the GPU process's own
    ring and messages (edge_vision/gpu_process)."""
    proc, report = small_bench(
        "handoff",
        *("--frames", "3000", "--batches", "1,8", "--rounds", "1", "--transport", transport),
        json_out=tmp_path / "handoff.json",
        timeout=T(100),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [r["batch"] for r in report["runs"]] == [1, 8]
    for r in report["runs"]:
        assert r["frames"] == 3000 and r["frames_per_s"] > 0
        assert r["worker_cpu_us_per_frame"] > 0 and r["gpu_process_cpu_us_per_frame"] > 0
    assert set(report["median"]) == {"1", "8"}


@pytest.mark.timeout(180)
def test_the_gpu_process_bench_answers_every_frame_and_times_the_processs_own_python(
    tmp_path: Path,
) -> None:
    """python -m benchmarks.gpu_process, tiny: the real GPU process with a decoder and an
    engine that do no work answers every frame of two workers' rings (the bench fails on
    any other answer), and its CPU a frame, all and its event loop's, is reported."""
    proc, report = small_bench(
        "gpu_process",
        *("--frames", "400", "--workers", "2", "--rounds", "1"),
        json_out=tmp_path / "gpu_process.json",
        timeout=T(150),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run,) = report["runs"]
    assert run["frames"] == 400 and run["frames_per_s"] > 0
    assert 0 < run["loop_cpu_us_per_frame"] <= run["gpu_process_cpu_us_per_frame"]


@pytest.mark.timeout(240)
def test_the_overhead_bench_answers_every_frame_with_the_stand_in_model_and_splits_cpu_by_role(
    tmp_path: Path,
) -> None:
    """python -m benchmarks.overhead, tiny: a real server serves real JPEGs with the
    stand-in detector, which finds boxes on them, each variant is its own server with its
    settings applied (a bad setting fails the bench), every frame is answered, and the
    server's CPU a frame is reported by role, the engine's left out of service_ms."""
    proc, report = small_bench(
        "overhead",
        *("--cameras", "2", "--fps", "10", "--duration", "4", "--rounds", "1"),
        *("--variants", "base:;uvloop:--set server.event_loop=uvloop"),
        json_out=tmp_path / "overhead.json",
        timeout=T(200),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [r["variant"] for r in report["runs"]] == ["base", "uvloop"]
    assert report["runs"][1]["sets"] == ["--set", "server.event_loop=uvloop"]
    for r in report["runs"]:
        assert r["sent"] == 2 * 10 * 4 and r["answered_share"] > 0.8
        # The stand-in gives the real detector's 2 boxes a frame on the bench's frames, so
        # post-processing, tracker and replies carry boxes (the bench checks it first).
        assert r["stand_in_boxes_a_frame"] >= 1
        assert r["loop_ms"] > 0 and r["ms_by_role"]["post"] > 0 and "ort" in r["ms_by_role"]
        assert 0 < r["service_ms"] < r["server_ms"]  # the engine's own thread left out
    assert set(report["median"]) == {"base", "uvloop"}
    bad, _ = small_bench(
        "overhead",
        *("--duration", "2", "--rounds", "1", "--variants", "typo:--set engine.no_such_key=1"),
        json_out=None,
        timeout=T(100),
    )
    assert bad.returncode != 0 and "no_such_key" in bad.stderr


@pytest.mark.timeout(180)
def test_engine_only_waits_for_its_start_time_so_processes_are_timed_together(
    tmp_path: Path,
) -> None:
    """--engine-start-at: several engine-only runs (one a worker process) load and
    capture on their own, then all start timing at the same wall-clock moment."""
    import time

    start_at = time.time() + T(12)  # past this machine's model load and warm-up
    r = bench(
        tmp_path,
        "--engine-only",
        "--batches",
        "1",
        "--engine-seconds",
        "0.3",
        "--engine-start-at",
        str(start_at),
    )
    eo = r["engine_only"]
    assert start_at <= eo["timed_from"] < start_at + 2
    assert eo["timed_until"] > eo["timed_from"]
    assert eo["rows"][0]["serial"]["frames_per_s"] > 0


def _servers(parent: int | None = None) -> set[int]:
    """The live ``edge_vision serve`` processes (of ``parent``, when given), from /proc."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        mine = parent is None or int(ppid) == parent
        if mine and state != "Z" and b"edge_vision\0serve" in cmdline:
            pids.add(int(stat.parent.name))
    return pids


@pytest.mark.timeout(300)
def test_a_bench_stopped_by_sigterm_keeps_the_counts_it_finished_and_stops_its_server(
    tmp_path: Path,
) -> None:
    """A bench over several camera counts that a timeout stops (``timeout``, a device
    call's limit) leaves the counts that finished in results.json, marked partial, and
    takes its server down with it: on 2026-12-02 a 64/96/128-camera run on the H200 lost
    two finished counts this way."""
    import signal
    import time

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "edge_vision", "bench", "--out", str(out), "--frames", "8"]
    argv += ["--resolution", "640x360", "--cameras", "1,2", "--fps", "4", "--duration", "3"]
    log = tmp_path / "bench.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    results = out / "results.json"
    try:
        deadline = time.monotonic() + T(180)
        while time.monotonic() < deadline:
            done = json.loads(results.read_text()) if results.exists() else {}
            if done.get("runs") and _servers(proc.pid):  # count 2's server is starting
                break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("the first count's results never reached results.json")
        servers = _servers(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(T(60)) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = json.loads(results.read_text())
    assert kept["partial"] is True
    assert [r["cameras"] for r in kept["runs"]] == [1]
    assert kept["runs"][0]["sent"] == 4 * 3 and kept["runs"][0]["answered"] > 0
    assert servers and not servers & _servers(), "the bench's server was left running"


@pytest.mark.timeout(300)
def test_one_server_runs_every_camera_count_against_a_server_started_once(
    tmp_path: Path,
) -> None:
    """``--one-server``: a sweep pays the server's warm-up once (on a GPU host, 12 workers
    loading a compiled engine take 60-90 s a start), and each count's figures are still
    its own: its frames, its server CPU, its memory samples."""
    r = bench(tmp_path, "--one-server", "--cameras", "1,2", "--fps", "4", "--duration", "3")
    assert "partial" not in r
    assert [run["cameras"] for run in r["runs"]] == [1, 2]
    for run in r["runs"]:
        n = run["cameras"]
        assert run["sent"] == n * 4 * 3 and run["errors"] == 0, run
        assert run["answered"] + run["dropped"] == run["sent"] and run["answered"] > 0
        assert run["server_cpu_s"] > 0
        # the memory samples of this run only (times from its own start, so one pass of
        # rising times; the first run's samples before them would start the clock again)
        times = [t for t, _ in run["rss_mib"]["samples"]]
        assert times and times == sorted(times), times
    log = (tmp_path / "out" / "server.log").read_text()
    assert log.count("node ready") == 1, log[-3000:]


def test_one_server_refuses_compare_rather_than_time_the_baseline_beside_our_server(
    tmp_path: Path,
) -> None:
    argv = [sys.executable, "-m", "edge_vision", "bench", "--one-server", "--compare"]
    proc = subprocess.run(
        [*argv, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=T(60),
    )
    assert proc.returncode == 2
    assert "--one-server and --compare cannot go together" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran
