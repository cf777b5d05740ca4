"""A node-wide memory budget: bytes held by frames and frame buffers, across connections.

Without it nothing capped the total: 8 MiB messages held in the waiting slot, in decoding
and in flight cost 70-110 MB per connection, and 40 connections took 3.1 GB (issue 12).
The budget counts, in bytes:

* ``frames``: every admitted frame's encoded bytes (plus the bytes base64 decodes to),
  from admission until it is answered, rejected, dropped or superseded;
* ``decode``: a frame's decoded pixels while a decoder that does not write into the
  pool (OpenCV, Pillow, PyTurboJPEG) holds them;
* ``pool``: every buffer of :class:`~edge_vision.frames.decode.BufferPool`, in use (decoded
  pixels, letterboxed canvases) or idle in its free lists.

A frame that does not fit is never silently lost: in ``every`` mode its connection stops
reading while it waits for room (TCP back-pressure), for at most ``server.memory_wait_s``;
in ``latest`` mode, and after that wait, it is answered with the error
``over_memory_budget``. Admitted frames may use the budget up to ``limit - headroom``; the
headroom (a quarter) is left to decode and pool allocations, so a frame admitted is not
then refused for want of decode memory.

Beyond the budget each connection holds at most the message its reader has in hand and
one more in aiohttp's read queue (aiohttp pauses the socket past 128 KiB queued), so the
worst case is ``budget + 2 x server.max_message_bytes x connections`` (docs/security.md).

:class:`MemoryBudget` is the pure, thread-safe policy (worker threads release pool
buffers); :class:`FrameLedger` is one connection's record of what its frames hold;
:func:`wait_for_room` is the asyncio shell that waits for a release.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from typing import Final, Literal

from .aio import wait_event

Kind = Literal["frames", "decode", "pool"]
KINDS: Final[tuple[Kind, ...]] = ("frames", "decode", "pool")


class MemoryBudget:
    """Bytes held against one limit, by kind. ``try_acquire`` never blocks and never
    overshoots: it takes the bytes and says True, or takes nothing and says False."""

    def __init__(self, limit: int, headroom: int | None = None) -> None:
        if limit < 1:
            raise ValueError("memory budget limit must be >= 1 byte")
        self.limit = limit
        self.headroom = limit // 4 if headroom is None else headroom
        if not 0 <= self.headroom < limit:
            raise ValueError("headroom must be in [0, limit)")
        self._held: dict[Kind, int] = dict.fromkeys(KINDS, 0)
        self._total = 0
        self.peak = 0  # most bytes ever held at once
        self.waiting = 0  # bytes of frames waiting for room (held by readers, not counted)
        self.refused = 0  # acquisitions that did not fit
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    @property
    def held(self) -> int:
        return self._total

    def held_by(self, kind: Kind) -> int:
        return self._held[kind]

    @property
    def admit_limit(self) -> int:
        """What admitted frames may fill; the rest is headroom for decode and the pool."""
        return self.limit - self.headroom

    def fits(self, nbytes: int, kind: Kind = "frames", credit: int = 0) -> bool:
        """Whether ``nbytes`` of ``kind`` fit now; ``credit`` bytes held now are about to
        be released by the caller (a latest-wins frame being replaced) and count as room."""
        cap = self.admit_limit if kind == "frames" else self.limit
        return self._total - credit + nbytes <= cap

    def try_acquire(self, nbytes: int, kind: Kind, credit: int = 0) -> bool:
        """Take ``nbytes`` if they fit (see :meth:`fits`). With ``credit`` the total may
        exceed the limit by at most that much until the caller releases it."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            if not self.fits(nbytes, kind, credit):
                self.refused += 1
                return False
            self._held[kind] += nbytes
            self._total += nbytes
            self.peak = max(self.peak, self._total)
            return True

    def release(self, nbytes: int, kind: Kind) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            if nbytes > self._held[kind]:
                raise RuntimeError(
                    f"released {nbytes} {kind} bytes but only {self._held[kind]} are held"
                )
            self._held[kind] -= nbytes
            self._total -= nbytes
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def add_listener(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (from the releasing thread) after every release; returns the
        function that removes it."""
        with self._lock:
            self._listeners.append(wake)

        def remove() -> None:
            with self._lock:
                if wake in self._listeners:
                    self._listeners.remove(wake)

        return remove


class FrameLedger:
    """What one connection's frames hold in the budget, so each is released exactly once
    however the frame ends, and a closing connection gives back everything it held."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self._charges: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._charges)

    @property
    def held(self) -> int:
        return sum(self._charges.values())

    def try_charge(self, key: Hashable, nbytes: int, *, credit: int = 0) -> bool:
        """Charge ``nbytes`` for ``key``; ``credit``: bytes of this connection released
        right after (the latest-wins frame this one replaces) count as room."""
        if key in self._charges:
            raise RuntimeError(f"frame {key!r} is already charged")
        if not self.budget.try_acquire(nbytes, "frames", credit):
            return False
        self._charges[key] = nbytes
        return True

    def charge_of(self, key: Hashable) -> int:
        return self._charges.get(key, 0)

    def release(self, key: Hashable) -> None:
        nbytes = self._charges.pop(key, 0)
        self.budget.release(nbytes, "frames")

    def release_all(self) -> int:
        """Give back every charge (the connection is closing); returns the bytes."""
        total = sum(self._charges.values())
        self._charges.clear()
        self.budget.release(total, "frames")
        return total


def frame_cost(image_len: int, base64: bool) -> int:
    """Bytes a frame holds until it is done: its encoded image, plus for base64 text the
    raw bytes it decodes to (both exist while it decodes)."""
    return image_len + (image_len * 3 // 4 if base64 else 0)


async def wait_for_room(budget: MemoryBudget, nbytes: int, timeout_s: float) -> bool:
    """Wait until ``nbytes`` of frames fit, for at most ``timeout_s``; True if they do
    (they are not taken: the caller charges them). Wakes on every release."""
    if budget.fits(nbytes):
        return True
    if timeout_s <= 0:
        return False
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def wake() -> None:  # any thread: a pool buffer may be freed in a worker
        loop.call_soon_threadsafe(changed.set)

    remove = budget.add_listener(wake)
    budget.waiting += nbytes
    deadline = loop.time() + timeout_s
    try:
        # A deadline loop rather than asyncio.timeout, which Python 3.10 (JetPack 6) lacks.
        while not budget.fits(nbytes):
            remaining = deadline - loop.time()
            changed.clear()  # a release from here on sets it again (call_soon_threadsafe)
            if remaining <= 0 or not await wait_event(changed, remaining):
                return budget.fits(nbytes)
        return True
    finally:
        budget.waiting -= nbytes
        remove()
