"""The node-wide memory budget (edge_vision/common/budget.py), the decoded-bytes cap, pools that
shrink, memory handed back after a burst — against a real server process whose resident
memory is read from /proc/<pid>/status."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from benchmarks import soak
from edge_vision.common.budget import FrameLedger, MemoryBudget, frame_cost
from edge_vision.common.buffers import BufferPool
from edge_vision.common.memory import freeze_startup_heap, release_to_system
from edge_vision.errors import ClientError
from edge_vision.frames.decode import check_decoded_limit, read_image_header

from ..support.clients import connect, frame_binary, recv
from ..support.images import jpeg, text_scene
from ..support.scrape import metric, metrics_text
from ..support.server import ServerProcess
from ..support.timing import T

MiB = 1024 * 1024


# -- helpers ---------------------------------------------------------------------------


def padded_jpeg(target_bytes: int) -> bytes:
    """A small real JPEG made ``target_bytes`` long (the soak bench's padding)."""
    return soak.padded_jpeg(jpeg(text_scene(320, 240).rgb, quality=80), target_bytes)


png_of_zeros = soak.png_of_zeros


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


# -- the pure policy -------------------------------------------------------------------


class _Node:
    """An object the cyclic collector tracks, that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def test_frozen_start_up_heap_is_not_walked_yet_later_cycles_are_still_collected() -> None:
    # Start-up's objects (torch's modules, the engine): never walked again by a collection.
    startup = [_Node() for _ in range(20_000)]
    garbage = _Node()  # start-up garbage in a cycle: collected before the freeze
    garbage.other = garbage
    garbage_ref = weakref.ref(garbage)
    del garbage
    try:
        frozen, _ms = freeze_startup_heap()
        assert garbage_ref() is None
        assert frozen >= len(startup)
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in startup[::1000])
        # What serving makes afterwards is collected as before: a closed connection's
        # reader and buffer sit in a cycle (memory.release_to_system).
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        cycle_ref = weakref.ref(a)
        del a, b
        release_to_system(trim_heap=False)
        assert cycle_ref() is None
        # A frozen object is still freed when its last reference goes.
        first_ref = weakref.ref(startup[0])
        del startup[0]
        assert first_ref() is None
    finally:
        gc.unfreeze()  # this test process is not a server


def test_budget_refuses_what_does_not_fit_and_keeps_headroom_for_decoding() -> None:
    b = MemoryBudget(100, headroom=20)
    assert b.try_acquire(50, "frames") and b.try_acquire(30, "frames")
    assert not b.try_acquire(1, "frames")  # frames stop at limit - headroom
    assert b.try_acquire(20, "pool")  # decode and pool buffers may use the headroom
    assert not b.try_acquire(1, "decode")
    assert (b.held, b.peak, b.refused) == (100, 100, 2)
    b.release(50, "frames")
    assert b.held_by("frames") == 30 and b.try_acquire(30, "frames")
    with pytest.raises(RuntimeError):
        b.release(61, "frames")  # more than held is a bug, not a number to go negative


def test_ledger_releases_each_frame_once_and_everything_on_close() -> None:
    b = MemoryBudget(1000, headroom=0)
    ledger = FrameLedger(b)
    assert ledger.try_charge("a", 300) and ledger.try_charge("b", 300)
    assert not ledger.try_charge("c", 500)
    # A latest-wins frame replacing "b" may count b's bytes as room.
    assert ledger.try_charge("c", 500, credit=ledger.charge_of("b"))
    ledger.release("b")
    ledger.release("b")  # a second release of the same frame gives nothing back
    assert b.held == 800
    ledger.release("a")
    assert ledger.release_all() == 500 and b.held == 0 and len(ledger) == 0
    assert frame_cost(1000, base64=True) == 1750 and frame_cost(1000, base64=False) == 1000


def test_pool_counts_its_buffers_refuses_over_budget_and_shrinks_to_idle_size() -> None:
    now = [0.0]
    budget = MemoryBudget(64 * MiB, headroom=0)
    pool = BufferPool(budget=budget, clock=lambda: now[0])
    bufs = [pool.acquire((1024, 1024, 3)) for _ in range(8)]  # 3 MiB -> 4 MiB classes
    assert budget.held_by("pool") == 32 * MiB and pool.in_use_bytes == 32 * MiB
    for buf in bufs:
        pool.release(buf)
    assert pool.free_bytes == 32 * MiB and budget.held_by("pool") == 32 * MiB
    assert pool.acquire((1024, 1024, 3)) is not None and pool.allocations == 8  # reused
    with pytest.raises(ClientError) as e:
        pool.acquire((6000, 6000, 3))  # 128 MiB class: over the whole budget
    assert e.value.code == "over_memory_budget"
    now[0] = 10.0
    assert pool.idle_for() == 10.0
    freed = pool.shrink(8 * MiB)
    assert freed == 20 * MiB and pool.free_bytes == 8 * MiB
    assert budget.held_by("pool") == 12 * MiB  # 8 idle + the one still handed out


def test_pool_frees_instead_of_keeping_while_frames_fill_the_budget() -> None:
    budget = MemoryBudget(16 * MiB, headroom=4 * MiB)
    pool = BufferPool(budget=budget)
    assert budget.try_acquire(8 * MiB, "frames")
    a, b = pool.acquire((1000, 1000, 3)), pool.acquire((1000, 1000, 3))  # 4 MiB classes
    assert budget.held == 16 * MiB  # the pool may use the headroom
    pool.release(a)  # over the admission limit (12 MiB): freed, not kept
    assert pool.free_bytes == 0 and budget.held == 12 * MiB
    pool.release(b)  # back within it: kept for reuse
    assert pool.free_bytes == 4 * MiB and budget.held == 12 * MiB


def test_png_bomb_is_refused_from_its_header_before_decoding() -> None:
    bomb = png_of_zeros(6320)
    assert len(bomb) < 200_000  # ~116 KB on the wire
    header = read_image_header(bomb)
    assert header.pixels < 40_000_000  # passes the pixel limit
    t0 = time.perf_counter()
    with pytest.raises(ClientError) as e:
        check_decoded_limit(header, None, 64 * MiB)
    assert e.value.code == "decoded_too_large" and time.perf_counter() - t0 < 0.01


# -- a real server -----------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_png_bomb_is_answered_decoded_too_large_and_the_next_frame_served(
    server_factory: Any,
) -> None:
    """An operator who lowers server.max_decoded_bytes (by default it follows the pixel
    limit) has the bomb refused from its header, not decoded."""
    srv = await server_factory({"server": {"max_decoded_bytes": 64 * MiB}})
    good = jpeg(text_scene(640, 360).rgb)
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, srv.ws_url + "?mode=every")
        t0 = time.perf_counter()
        await ws.send_bytes(frame_binary("bomb", None, png_of_zeros(6320)))
        err = await recv(ws)
        assert (err["type"], err["code"], err["id"]) == ("error", "decoded_too_large", "bomb")
        assert time.perf_counter() - t0 < T(2)  # refused from the header, not decoded
        await ws.send_bytes(frame_binary("good", None, good))
        res = await recv(ws)
        assert (res["type"], res["id"]) == ("result", "good")
        text = await metrics_text(http, srv.url)
        assert metric(text, 'edge_vision_frames_rejected_total{code="decoded_too_large"}') == 1
        await ws.close()


async def _burst(url: str, frame: bytes, n: int) -> list[dict[str, Any]]:
    """``n`` frames written back to back on one 'every' connection; their replies."""
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, url + "?mode=every")
        for i in range(n):
            await ws.send_bytes(frame_binary(i, None, frame))
        replies = [await recv(ws, timeout=60) for _ in range(n)]
        await ws.close()
    return replies


@pytest.mark.timeout(90)
@pytest.mark.parametrize("wait_s", [30.0, 0.0])
async def test_every_frames_over_budget_wait_for_room_or_are_rejected_never_lost(
    server_factory: Any, wait_s: float
) -> None:
    # 16 MiB budget, 12 MiB for admitted frames: two 5 MiB frames fit, the third does not.
    srv = await server_factory(
        {"server": {"memory_budget_bytes": 16 * MiB, "memory_wait_s": wait_s}}
    )
    replies = await _burst(srv.ws_url, padded_jpeg(5 * MiB), 5)
    async with aiohttp.ClientSession() as http:
        text = await metrics_text(http, srv.url)
    over = [r for r in replies if r["type"] == "error"]
    # Every frame has its reply (a refusal is sent at once, ahead of earlier results).
    assert sorted(r["id"] for r in replies) == list(range(5))
    assert all(r["code"] == "over_memory_budget" for r in over), over
    assert metric(text, "edge_vision_memory_waits_total") >= 1  # the reader paused for room
    if wait_s:
        assert not over  # it waited, then was served
    else:
        assert over  # no wait: refused with the code, counted as rejected
        rejected = metric(text, 'edge_vision_frames_rejected_total{code="over_memory_budget"}')
        assert rejected == len(over)
    assert metric(text, "edge_vision_memory_peak_bytes") <= 16 * MiB


BUDGET = 192 * MiB
IDLE = 16 * MiB


async def _client(
    http: aiohttp.ClientSession, url: str, frame: bytes, window: int, until: float
) -> dict[str, Any]:
    """Keep ``window`` frames in flight (a reply or a reported drop frees a place) until
    ``until``, then close. Returns what the client counted."""
    ws, _ = await connect(http, url)
    sent = answered = dropped = 0
    errors: dict[str, int] = {}
    try:
        while time.monotonic() < until:
            while sent - answered - dropped - sum(errors.values()) < window:
                await ws.send_bytes(frame_binary(sent, None, frame))
                sent += 1
            try:
                msg = await recv(ws, timeout=max(0.05, until - time.monotonic()))
            except TimeoutError:
                break
            if msg["type"] == "result":
                answered += 1
                dropped = msg["dropped"]
            elif msg["type"] == "error":
                errors[msg["code"]] = errors.get(msg["code"], 0) + 1
        return {"sent": sent, "answered": answered, "errors": errors}
    finally:
        await ws.close()


async def _frame_counters(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    text = await metrics_text(http, url)
    rejected = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("edge_vision_frames_rejected_total{")
    )
    return {
        "received": metric(text, "edge_vision_frames_received_total"),
        "answered": metric(text, "edge_vision_frames_answered_total"),
        "dropped": metric(text, "edge_vision_frames_dropped_total"),
        "rejected": rejected,
        "over_budget": metric(text, 'edge_vision_frames_rejected_total{code="over_memory_budget"}'),
        "held_peak": metric(text, "edge_vision_memory_peak_bytes"),
        "held_frames": metric(text, 'edge_vision_memory_held_bytes{kind="frames"}'),
        "connections": metric(text, "edge_vision_connections"),
    }


# Beyond the budget a connection holds about one message (of up to max_message_bytes)
# that aiohttp read ahead (budget.py, docs/security.md): the documented worst case the
# peak is checked against, plus 64 MiB for transient copies. Measured: 236-690 MiB;
# 818-886 MiB on 2026-12-01 with glibc's rising mmap threshold, which kept 8 MiB blocks
# in the heap; 611-681 MiB with server.mmap_threshold_bytes at 256 KiB (memory.py).
BEYOND_BUDGET = 64 * 9 * MiB + 64 * MiB


@pytest.mark.timeout(120)
async def test_64_connections_of_8mib_frames_stay_under_the_budget_and_memory_comes_back(
    tmp_path: Path,
) -> None:
    srv = ServerProcess(
        f"server.memory_budget_bytes={BUDGET}",
        f"server.max_message_bytes={9 * MiB}",
        "server.memory_wait_s=0.5",
        f"decode.pool_idle_bytes={IDLE}",
        "decode.pool_idle_s=0.5",
        "server.max_connections=128",
        "limits.max_connections_per_address=128",
        "model.input_size=320",  # a cheap inference: this test is about bytes
        log_path=tmp_path / "server.log",
    )
    await asyncio.to_thread(srv.start)
    try:
        await srv.wait_ready()
        assert srv.proc is not None
        pid = srv.proc.pid
        frame = padded_jpeg(8 * MiB - 4096)
        small = jpeg(text_scene(320, 240).rgb)
        async with aiohttp.ClientSession() as http:
            # Warm the frame path once (decode threads, arenas), then let the pool go idle.
            await _client(http, srv.ws_url, small, 1, time.monotonic() + 0.5)
            await asyncio.sleep(1.5)
            start = await asyncio.to_thread(rss_bytes, pid)
            idle = [await connect(http, srv.ws_url) for _ in range(64)]
            per_idle = (await asyncio.to_thread(rss_bytes, pid) - start) / 64
            for ws, _ in idle:
                await ws.close()

            until = time.monotonic() + T(4)
            counts = await asyncio.gather(
                *(_client(http, srv.ws_url, frame, 2, until) for _ in range(64))
            )
            deadline = time.monotonic() + T(10)  # every connection's frames done with
            while (c := await _frame_counters(http, srv.url))["connections"] or c["held_frames"]:
                assert time.monotonic() < deadline, c
                await asyncio.sleep(0.1)
            hwm = await asyncio.to_thread(rss_bytes, pid, "VmHWM")  # the peak RSS
            print(
                f"\nRSS at start {start / MiB:.0f} MiB; {per_idle / 1024:.0f} KiB per idle "
                f"connection; peak {(hwm - start) / MiB:+.0f} MiB under load (budget "
                f"{BUDGET / MiB:.0f} MiB, held at most {c['held_peak'] / MiB:.0f} MiB); {c}"
            )
            # Nothing lost: every frame received was answered, dropped or rejected.
            assert c["received"] == c["answered"] + c["dropped"] + c["rejected"], c
            assert c["over_budget"] > 0 and c["answered"] > 0, c
            assert all(set(cl["errors"]) <= {"over_memory_budget"} for cl in counts), counts
            assert c["held_peak"] <= BUDGET
            assert hwm - start <= BUDGET + BEYOND_BUDGET, (hwm - start) / MiB
            # After the burst the pool shrinks to its idle size and the heap is trimmed.
            deadline = time.monotonic() + T(10)
            while (after := await asyncio.to_thread(rss_bytes, pid)) > start + IDLE + 50 * MiB:
                assert time.monotonic() < deadline, (after - start) / MiB
                await asyncio.sleep(0.25)
            print(f"RSS after the burst {(after - start) / MiB:+.0f} MiB")
            # ... with the start-up heap frozen (memory.freeze_startup_heap) once warm.
            assert srv.log_path is not None
            log_text = await asyncio.to_thread(srv.log_path.read_text)
            assert "start-up objects frozen" in log_text, log_text[-4000:]
    finally:
        await asyncio.to_thread(srv.stop)
