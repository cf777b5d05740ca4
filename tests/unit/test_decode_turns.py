"""Host decode turns (edge_vision/frames/decode_turns.py) and what a decode holds
(decode.decode_memory), as plain objects: literal costs, no server, no decoder."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from edge_vision.common.budget import MemoryBudget
from edge_vision.errors import ClientError
from edge_vision.frames.decode import decode_memory, jpeg_layout, read_image_header
from edge_vision.frames.decode_turns import QUICK_DECODE_S, DecodeTurns, Turn

MiB = 1024 * 1024


def _jpeg(w: int, h: int, *, progressive: bool, subsampling: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(
        out, "JPEG", progressive=progressive, subsampling=subsampling
    )
    return out.getvalue()


def test_a_progressive_jpeg_is_charged_its_coefficients_a_baseline_one_is_not() -> None:
    base = _jpeg(4000, 3000, progressive=False, subsampling=2)
    prog = _jpeg(4000, 3000, progressive=True, subsampling=2)
    prog444 = _jpeg(4000, 3000, progressive=True, subsampling=0)
    out = (500, 375)  # decoded at 1/8
    pixels = 500 * 375 * 3
    assert decode_memory(base, read_image_header(base), out) == pixels
    layout = jpeg_layout(prog)
    assert layout is not None and layout.whole_image_buffers
    # 4:2:0: Y at full size and two quarter-size planes, 2 bytes a coefficient.
    assert decode_memory(prog, read_image_header(prog), out) == pytest.approx(
        pixels + 4000 * 3000 * 1.5 * 2, rel=0.01
    )
    assert decode_memory(prog444, read_image_header(prog444), out) == pytest.approx(
        pixels + 4000 * 3000 * 3 * 2, rel=0.01
    )


def _refuse(nbytes: int) -> ClientError:
    return ClientError("over_memory_budget", f"{nbytes} bytes")


async def test_the_session_that_used_least_decode_time_goes_next() -> None:
    turns = DecodeTurns(1, MemoryBudget(1024 * MiB), 1.0, asyncio.get_running_loop())
    bomb, camera = object(), object()
    started: list[str] = []

    async def decode(owner: object, name: str, seconds: float) -> None:
        turn = await turns.acquire(owner, MiB, _refuse)
        started.append(name)
        await asyncio.sleep(seconds)
        turn.done()

    first = asyncio.create_task(decode(bomb, "bomb 1", 0.05))
    await asyncio.sleep(0.01)
    later = [asyncio.create_task(decode(bomb, f"bomb {i}", 0.05)) for i in (2, 3, 4)]
    await asyncio.sleep(0.01)
    cam = asyncio.create_task(decode(camera, "camera", 0.001))
    await asyncio.gather(first, *later, cam)
    # The camera waited for the decode running, not for the bombs queued before it.
    assert started[:2] == ["bomb 1", "camera"]
    assert turns.running == 0 and turns.held == 0


async def test_decodes_hold_at_most_half_the_budget_and_refuse_what_never_fits() -> None:
    budget = MemoryBudget(100 * MiB)
    turns = DecodeTurns(4, budget, 0.05, asyncio.get_running_loop())
    a = await turns.acquire("a", 40 * MiB, _refuse)
    waiting = asyncio.create_task(turns.acquire("b", 40 * MiB, _refuse))
    await asyncio.sleep(0.02)
    assert not waiting.done() and budget.held_by("decode") == 40 * MiB  # 80 > half
    a.done()
    b: Turn = await asyncio.wait_for(waiting, 1)
    assert budget.held_by("decode") == 40 * MiB
    b.done()
    alone = await turns.acquire("c", 70 * MiB, _refuse)  # over half: runs alone
    alone.done()
    with pytest.raises(ClientError):
        await turns.acquire("d", 101 * MiB, _refuse)  # more than the whole budget
    assert budget.try_acquire(75 * MiB, "frames")  # nothing running frees this
    with pytest.raises(ClientError, match="bytes"):  # after wait_s, not at once
        await asyncio.wait_for(turns.acquire("e", 30 * MiB, _refuse), 1)
    await asyncio.sleep(0)
    assert budget.held_by("decode") == 0 and turns.waiting == 0


async def test_a_decode_cancelled_while_waiting_leaves_nothing_held() -> None:
    budget = MemoryBudget(100 * MiB)
    turns = DecodeTurns(1, budget, 1.0, asyncio.get_running_loop())
    running = await turns.acquire("a", MiB, _refuse)
    queued = asyncio.create_task(turns.acquire("b", MiB, _refuse))
    await asyncio.sleep(0.01)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    running.done()
    await asyncio.sleep(0.01)
    assert turns.waiting == 0 and turns.running == 0 and budget.held == 0


async def test_slow_decodes_leave_one_slot_for_quick_ones() -> None:
    """Two slots, two sessions of slow decodes (bombs) each keeping two waiting: once
    their decodes are known to be slow they run one at a time, so a camera's quick decode
    starts at once instead of after a bomb's."""
    turns = DecodeTurns(2, MemoryBudget(1024 * MiB), 1.0, asyncio.get_running_loop())
    slow = QUICK_DECODE_S + 0.05
    peak_slow: list[int] = []

    async def decode(owner: str, seconds: float) -> float:
        asked = asyncio.get_running_loop().time()
        turn = await turns.acquire(owner, MiB, _refuse)
        waited = asyncio.get_running_loop().time() - asked
        peak_slow.append(turns.running_slow)
        await asyncio.sleep(seconds)
        turn.done()
        return waited

    # Their first decodes are not known to be slow yet: both slots.
    await asyncio.gather(decode("b1", slow), decode("b2", slow))
    assert turns.running == 0 and turns.running_slow == 0
    bombs = [asyncio.create_task(decode(b, slow)) for b in ("b1", "b2", "b1", "b2")]
    await asyncio.sleep(0.02)
    assert turns.running == 1 and turns.waiting == 3  # the other slot stays free
    camera_wait = await decode("cam", 0.001)
    assert camera_wait < 0.05  # it did not wait for a bomb's decode to end
    await asyncio.gather(*bombs)
    assert max(peak_slow[2:]) == 1
    assert turns.running == 0 and turns.running_slow == 0 and turns.held == 0
    # One slot: nothing to keep, slow decodes use it.
    one = DecodeTurns(1, MemoryBudget(1024 * MiB), 1.0, asyncio.get_running_loop())
    for _ in range(2):  # the second is known to be slow, and still starts
        turn = await asyncio.wait_for(one.acquire("b", MiB, _refuse), 1)
        await asyncio.sleep(slow)
        turn.done()
        await asyncio.sleep(0.01)
    assert one.running == 0 and one.running_slow == 0
