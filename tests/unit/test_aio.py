"""The asyncio helpers the batcher, the replies and shutdown rely on: a timeout fires, a
result wins, and a cancel() is never lost (the wait_for bug these helpers exist for)."""

from __future__ import annotations

import asyncio

import pytest

from edge_vision.common.aio import cancel_and_wait, wait_event, with_timeout, within


@pytest.mark.parametrize("helper", [with_timeout, within])
async def test_a_result_in_time_is_returned_and_a_late_one_times_out(helper: object) -> None:
    async def after(s: float) -> str:
        await asyncio.sleep(s)
        return "done"

    assert await helper(after(0.0), 1.0) == "done"  # type: ignore[operator]
    with pytest.raises(TimeoutError):
        await helper(after(5.0), 0.05)  # type: ignore[operator]


async def test_wait_event_says_whether_the_event_came() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.02) is False
    asyncio.get_running_loop().call_later(0.01, ev.set)
    assert await wait_event(ev, 5.0) is True
    assert await wait_event(ev, 0.0) is True  # already set: no wait at all


@pytest.mark.parametrize("helper", [with_timeout, within])
async def test_a_cancel_arriving_with_the_result_is_not_lost(helper: object) -> None:
    """The waiter is cancelled in the same loop iteration as its awaitable completes; the
    cancellation must still reach it (asyncio.wait_for on 3.11 returned the result)."""
    lost = 0
    for _ in range(50):
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiter = asyncio.ensure_future(helper(fut, 5.0))  # type: ignore[operator]
        await asyncio.sleep(0)  # the waiter is now waiting on fut
        fut.set_result(1)
        waiter.cancel()
        try:
            await waiter
            lost += 1
        except asyncio.CancelledError:
            pass
    assert lost == 0


async def test_cancel_and_wait_ends_running_tasks_and_tolerates_the_rest() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ValueError("already failed")

    running = asyncio.ensure_future(forever())
    failed = asyncio.ensure_future(fails())
    await asyncio.sleep(0)  # both have started; one has failed
    await cancel_and_wait(running, failed, None)
    assert running.cancelled() and failed.done() and not failed.cancelled()
