"""Small asyncio helpers that never swallow a cancellation.

``asyncio.wait_for`` on Python 3.10/3.11 loses a ``cancel()`` that arrives in the same loop
iteration as the awaited result (CPython gh-86296): a background loop then keeps running
after shutdown cancelled it, and the app hangs in cleanup. These helpers are built on
``asyncio.wait``, which lets the cancellation through on every supported Python.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def with_timeout(aw: Awaitable[T], timeout: float | None) -> T:
    """``await aw`` for at most ``timeout`` seconds, else TimeoutError (aw is cancelled)."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})  # let it unwind; our own cancel still propagates
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at GC
        raise TimeoutError
    return task.result()


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """``with_timeout`` for hot paths (a reply per frame, every batcher wake-up): on Python
    3.11+ a deadline on the current task (``asyncio.timeout``: one timer, no extra task,
    cancellation-safe); on 3.10 the general helper."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await aw
    return await with_timeout(aw, timeout)


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; True when it was set."""
    if event.is_set():
        return True
    try:
        await within(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel the tasks (None and finished ones are fine) and wait until each has ended;
    what they return or raise is dropped."""
    running = [t for t in tasks if t is not None]
    for t in running:
        t.cancel()
    await asyncio.gather(*running, return_exceptions=True)
