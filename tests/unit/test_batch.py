"""Batch planning: same-shape frames together, bounded waits, no head-of-line blocking."""

from __future__ import annotations

import asyncio

from edge_vision.frames.batch import Batcher, BatchPlanner, ReadyBatch

A, B = (384, 640), (480, 640)


def test_full_bucket_is_ready_at_once() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=2, window_s=1.0)
    p.add(A, "a1", 0.0)
    assert p.pop_ready(0.0) is None
    p.add(A, "a2", 0.0)
    batch = p.pop_ready(0.0)
    assert batch is not None and batch.items == ["a1", "a2"] and batch.shape == A


def test_window_bounds_the_wait_of_a_lonely_frame() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=8, window_s=0.005)
    p.add(A, "a1", 1.0)
    assert p.next_deadline() == 1.005
    assert p.pop_ready(1.004) is None
    batch = p.pop_ready(1.005)
    assert batch is not None and batch.items == ["a1"]


def test_other_shapes_are_not_held_up_and_oldest_goes_first() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=4, window_s=0.01)
    p.add(B, "b1", 0.000)
    p.add(A, "a1", 0.001)
    p.add(A, "a2", 0.002)
    first = p.pop_ready(1.0)
    second = p.pop_ready(1.0)
    assert first is not None and first.items == ["b1"]
    assert second is not None and second.items == ["a1", "a2"]
    assert len(p) == 0


def test_batches_never_exceed_max_batch() -> None:
    p: BatchPlanner[int] = BatchPlanner(max_batch=3, window_s=0.0)
    for i in range(7):
        p.add(A, i, 0.0)
    sizes = []
    while (b := p.pop_ready(0.0)) is not None:
        sizes.append(len(b.items))
    assert sizes == [3, 3, 1]


async def test_batcher_groups_frames_submitted_while_the_engine_is_busy() -> None:
    seen: list[list[int]] = []
    gate = asyncio.Event()

    async def run(batch: ReadyBatch[int]) -> None:
        seen.append(batch.items)
        if len(seen) == 1:
            await gate.wait()  # the first batch keeps the only engine slot busy

    batcher: Batcher[int] = Batcher(run, max_batch=4, window_s=0.0, max_in_flight=1)
    batcher.start()
    batcher.submit(A, 0)
    await asyncio.sleep(0.01)
    for i in range(1, 6):
        batcher.submit(A, i)
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.sleep(0.02)
    await batcher.stop()
    assert seen == [[0], [1, 2, 3, 4], [5]]


def test_a_newer_frame_of_the_same_key_takes_the_waiting_frames_place() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    p.add(A, "cam1-frame1", 0.0, key="cam1")
    p.add(A, "cam2-frame1", 0.1, key="cam2")
    assert p.add(A, "cam1-frame2", 0.2, key="cam1") == "cam1-frame1"
    first = p.pop_ready(1.0)
    second = p.pop_ready(1.0)
    # cam1 keeps its place in the queue but the engine gets its newest frame.
    assert first is not None and first.items == ["cam1-frame2"]
    assert second is not None and second.items == ["cam2-frame1"]
    assert p.add(A, "cam1-frame3", 2.0, key="cam1") is None  # nothing of cam1 was waiting


def test_a_newer_frame_of_another_size_is_requeued_in_its_own_bucket() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=4, window_s=0.0)
    p.add(A, "small", 0.0, key="cam")
    assert p.add(B, "big", 0.5, key="cam") == "small"
    assert len(p) == 1
    batch = p.pop_ready(1.0)
    assert batch is not None and batch.shape == B and batch.items == ["big"]


def test_a_polite_sessions_frame_goes_in_the_next_batch_beside_a_flooding_session() -> None:
    """One latest-wins session always has a frame waiting (it floods); the other sends a
    frame now and then. First come, first served, the polite frame would wait behind the
    flooder's older waiting frame; served least recently first, it goes next."""
    p: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    t = 0.0
    served: list[str] = []
    for i in range(12):
        t += 1.0
        p.add(A, f"flood{i}", t, key="flooder")  # replaces its waiting frame, keeps its place
        if i % 3 == 1:
            p.add(A, f"polite{i}", t + 0.5, key="polite")
        batch = p.pop_ready(t + 0.9)
        assert batch is not None
        served += batch.items
    for i in range(1, 12, 3):
        assert served[i] == f"polite{i}"  # in the batch right after it arrived
        assert served[i + 1] == f"flood{i + 1}"  # then the flooder's newest frame
    assert sum(s.startswith("flood") for s in served) == 8  # the flooder is never starved


def test_every_session_gets_a_turn_before_one_gets_a_second() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=2, window_s=0.0)
    for i in range(3):
        p.add(A, f"a{i}", 0.0 + i, owner="a")  # in-order frames of one session: no key
    p.add(A, "b0", 5.0, owner="b")
    p.add(A, "c0", 6.0, owner="c")
    first, second, third = (p.pop_ready(10.0) for _ in range(3))
    assert first is not None and first.items == ["a0", "a1"]  # nobody served yet: oldest
    assert second is not None and second.items == ["b0", "c0"]  # a was just served
    assert third is not None and third.items == ["a2"]


def _turns(p: BatchPlanner[str], costs: dict[str, float], turns: int) -> list[str]:
    """Every owner of ``costs`` keeps a frame waiting (in-order sessions, no key); the
    owners served, ``turns`` batches of one."""
    served: list[str] = []
    t = 0.0
    for owner in costs:
        p.add(A, owner, t, owner=owner, cost=costs[owner])
    for _ in range(turns):
        t += 1.0
        batch = p.pop_ready(t)
        assert batch is not None
        [owner] = batch.items
        served.append(owner)
        p.add(A, owner, t, owner=owner, cost=costs[owner])
    return served


def test_a_session_whose_frames_cost_more_host_time_gets_fewer_turns_in_proportion() -> None:
    """Issue 36: a session of 21 MP PNGs (half a second of decode and letterbox a frame)
    beside cameras whose frames cost 5 ms: equal turns would give it a third of the engine
    on top of the cores its decodes take; charged by host time, the cameras get a hundred
    turns for each of its."""
    p: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    served = _turns(p, {"bomb": 0.5, "cam1": 0.005, "cam2": 0.005}, 404)
    assert served.count("bomb") in (3, 4, 5)
    assert abs(served.count("cam1") - served.count("cam2")) <= 1


def test_sessions_whose_frames_cost_alike_take_turns() -> None:
    p: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    served = _turns(p, {"a": 0.01, "b": 0.012, "c": 0.009}, 30)
    for i in range(27):  # none waits much more than one round
        assert set(served[i : i + 4]) == {"a", "b", "c"}, served
    # No cost given (frames decoded on the device): they take turns as well.
    q: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    assert _turns(q, {"x": 0.0, "y": 0.0}, 6) == ["x", "y"] * 3


def test_a_camera_back_from_idle_goes_before_expensive_frames_but_earns_no_credit() -> None:
    """A camera that sends a frame now and then, beside two sessions that always have an
    expensive frame waiting: each of its frames goes in the next batch (it has cost less),
    but its idle time is not saved up: once it floods too, it takes turns by cost."""
    p: BatchPlanner[str] = BatchPlanner(max_batch=1, window_s=0.0)
    t = 0.0
    for owner in ("b1", "b2"):
        p.add(A, owner, t, owner=owner, cost=0.3)
    for _ in range(3):
        for _ in range(5):  # the bombs run while the camera idles
            t += 1.0
            batch = p.pop_ready(t)
            assert batch is not None and batch.items[0].startswith("b")
            p.add(A, batch.items[0], t, owner=batch.items[0], cost=0.3)
        p.add(A, "cam", t + 0.5, owner="cam", cost=0.3)  # as costly as a bomb, for once
        batch = p.pop_ready(t + 0.6)
        assert batch is not None and batch.items == ["cam"]  # next, not after the bombs
    # Idle earned nothing: flooding now with frames as costly as theirs, it gets a third.
    served = []
    for _ in range(30):
        p.add(A, "cam", t, owner="cam", cost=0.3)
        t += 1.0
        batch = p.pop_ready(t)
        assert batch is not None
        served.append(batch.items[0])
        if batch.items[0] != "cam":
            p.add(A, batch.items[0], t, owner=batch.items[0], cost=0.3)
    assert 9 <= served.count("cam") <= 11, served


async def test_the_batcher_charges_each_frames_cost_to_its_session() -> None:
    seen: list[str] = []
    gate = asyncio.Event()

    async def run(batch: ReadyBatch[str]) -> None:
        seen.extend(batch.items)
        if len(seen) == 1:
            await gate.wait()

    batcher: Batcher[str] = Batcher(run, max_batch=1, window_s=0.0, max_in_flight=1)
    batcher.start()
    batcher.submit(A, "warm", owner="warm")
    await asyncio.sleep(0.01)
    for i in range(3):
        batcher.submit(A, f"png{i}", owner="png", cost=0.4)
    for i in range(3):
        batcher.submit(A, f"cam{i}", owner="cam", cost=0.004)
    gate.set()
    await asyncio.sleep(0.05)
    await batcher.stop()
    # The PNG session's first frame was older; after it, the camera's three go first.
    assert seen == ["warm", "png0", "cam0", "cam1", "cam2", "png1", "png2"]
