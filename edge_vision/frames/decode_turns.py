"""Host decodes shared fairly between sessions, each charged to the memory budget before
it starts.

Two rules, one class (:class:`DecodeTurns`), driven from the event loop:

* **Fair time.** At most ``slots`` host decodes run at once (the decode workers). When
  more wait, the next to start is the one whose session has used the least decode time:
  start-time fair queuing (Goyal et al., SIGCOMM 1996) with decode seconds as the work.
  Each session carries a tag that its decodes advance by the time they took; a session
  that comes back from idle starts at the tag of the decode that started last, so idling
  earns no credit; the waiting decode with the smallest tag plus its session's last
  decode time goes first. A camera whose frames decode in 10 ms therefore goes ahead of
  sessions whose bombs take a second each, and waits at most for the decodes already
  running; the bombs share what is left.
* **A slot for quick decodes.** With two slots or more, decodes expected to be slow
  (their session's last decode took over :data:`QUICK_DECODE_S`) hold at most all slots
  but one: the last is kept for quick ones, so a camera's frame never waits for a bomb's
  decode to end, and sessions of slow decodes cannot take every core the engine also
  needs. A session's first decode counts as quick (nothing is known of it yet).
* **Memory first.** A decode starts only once what it will hold
  (:func:`~edge_vision.frames.decode.decode_memory`: the pixels, a progressive JPEG's
  coefficient buffers) fits the memory budget; it is charged then, as ``decode``, and
  released when the decode ends. Decodes together hold at most half the budget (a larger
  one runs alone), so frames are still admitted while bombs decode: the other half is
  theirs. A decode that does not fit waits while others run (each ends and frees its
  charge), and ``wait_s`` once none runs; then it is answered ``over_memory_budget``. One
  larger than the whole budget is refused at once.

The shell (:class:`~edge_vision.frames.pipeline.FramePipeline`) takes a :class:`Turn` with
:meth:`DecodeTurns.acquire` before it hands the frame to a worker, and the worker calls
:meth:`Turn.done` (from any thread) when the decode is over, also when its caller was
cancelled meanwhile, so the charge lasts exactly as long as the memory does.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ..common.budget import MemoryBudget
from ..errors import ClientError

#: How often idle sessions' records are forgotten (those with no credit left).
_SWEEP_S = 1.0

#: A decode expected to take longer than this (seconds: its session's last one did) is
#: slow: slow decodes leave one slot free for quick ones. A 720p JPEG decodes in 3-15 ms
#: on a 2-core machine under load, a 4,600² PNG of zeros in 0.3-1 s.
QUICK_DECODE_S = 0.1


@dataclass(slots=True)
class _Owner:
    tag: float = 0.0  # decode seconds used, on the shared virtual clock
    last_s: float = 0.0  # its last decode's time: what its next one is expected to take
    waiting: int = 0
    running: int = 0


@dataclass(slots=True)
class _Waiter:
    seq: int
    owner: Hashable | None
    cost: int
    future: asyncio.Future[Turn]
    refuse: Callable[[int], ClientError]
    deadline: float | None = None  # set once nothing runs that could free room


@dataclass(eq=False, slots=True)
class Turn:
    """One started decode: its slot and its charge, until :meth:`done`."""

    turns: DecodeTurns
    owner: Hashable | None
    charged: int
    expected_s: float
    started: float = field(default_factory=time.perf_counter)
    _over: bool = False

    def done(self) -> None:
        """The decode is over (any thread; a second call does nothing): the charge goes
        back at once, the slot and the session's time on the event loop."""
        if self._over:
            return
        self._over = True
        self.turns.budget.release(self.charged, "decode")
        elapsed = time.perf_counter() - self.started
        try:
            self.turns.loop.call_soon_threadsafe(self.turns._ended, self, elapsed)
        except RuntimeError:  # the loop is closed: the process is stopping
            pass


class DecodeTurns:
    """Fair, budgeted host decode turns (see the module docstring)."""

    def __init__(
        self, slots: int, budget: MemoryBudget, wait_s: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        self.budget = budget
        self.wait_s = wait_s
        self.loop = loop
        self.running = 0
        self.running_slow = 0  # of them, decodes expected to take over QUICK_DECODE_S
        self.held = 0  # bytes the running decodes hold
        self.cap = budget.limit // 2  # what they may hold together (one larger runs alone)
        self._clock = 0.0  # the tag of the decode that started last
        self._owners: dict[Hashable | None, _Owner] = {}
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        self._swept = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        budget.add_listener(self._released)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(
        self, owner: Hashable | None, cost: int, refuse: Callable[[int], ClientError]
    ) -> Turn:
        """Wait for ``owner``'s turn and for ``cost`` bytes of room, then hold both.
        ``refuse(cost)`` makes the error for a decode that cannot have room (raised)."""
        if cost > self.budget.limit:
            raise refuse(cost)
        rec = self._owners.get(owner)
        if rec is None:
            rec = self._owners[owner] = _Owner(tag=self._clock)
        elif rec.waiting == 0 and rec.running == 0:
            rec.tag = max(rec.tag, self._clock)  # back from idle: no credit for it
        rec.waiting += 1
        waiter = _Waiter(next(self._seq), owner, cost, self.loop.create_future(), refuse)
        self._waiting.append(waiter)
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:
                    waiter.future.result().done()  # granted as we were cancelled
            elif waiter in self._waiting:
                self._forget(waiter)
            raise

    def _forget(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._owners[waiter.owner].waiting -= 1

    def _released(self) -> None:
        """(Any thread.) Budget room came back: a waiting decode may fit now."""
        if self._waiting:
            try:
                self.loop.call_soon_threadsafe(self._dispatch)
            except RuntimeError:  # the loop is closed
                pass

    def _ended(self, turn: Turn, elapsed: float) -> None:
        self.running -= 1
        self.running_slow -= turn.expected_s > QUICK_DECODE_S
        self.held -= turn.charged
        rec = self._owners.get(turn.owner)
        if rec is not None:
            rec.running -= 1
            rec.tag += elapsed - turn.expected_s  # what it took, not what it was expected to
            rec.last_s = elapsed
        now = time.monotonic()
        if now - self._swept > _SWEEP_S:
            self._swept = now
            idle = [
                k
                for k, r in self._owners.items()
                if r.waiting == 0 and r.running == 0 and r.tag <= self._clock
            ]
            for k in idle:  # they would start from the clock anyway
                del self._owners[k]
        self._dispatch()

    def _order(self, waiter: _Waiter) -> tuple[float, int]:
        rec = self._owners[waiter.owner]
        return (rec.tag + rec.last_s, waiter.seq)

    def _dispatch(self) -> None:
        while self._waiting and self.running < self.slots:
            for waiter in sorted(self._waiting, key=self._order):
                if waiter.future.done():  # cancelled while queued
                    self._forget(waiter)
                    break
                if self._owners[waiter.owner].last_s > QUICK_DECODE_S and (
                    self.running_slow >= self.slots - 1 > 0
                ):
                    continue  # the last slot is kept for quick decodes
                ours = self.running == 0 or self.held + waiter.cost <= self.cap
                fits = ours and self.budget.fits(waiter.cost, "decode")  # not a "refused"
                if fits and self.budget.try_acquire(waiter.cost, "decode"):
                    self._start(waiter)
                    break
            else:
                self._hold_or_refuse()
                return

    def _start(self, waiter: _Waiter) -> None:
        self._forget(waiter)
        rec = self._owners[waiter.owner]
        self.running += 1
        self.running_slow += rec.last_s > QUICK_DECODE_S
        self.held += waiter.cost
        rec.running += 1
        self._clock = max(self._clock, rec.tag)
        expected = rec.last_s
        rec.tag += expected  # counted now, corrected when it ends
        waiter.future.set_result(Turn(self, waiter.owner, waiter.cost, expected))

    def _hold_or_refuse(self) -> None:
        """No waiting decode fits. While decodes run, their ends will free room; once
        none runs, each waits ``wait_s`` more, then is refused."""
        if self.running > 0:
            for waiter in self._waiting:
                waiter.deadline = None
            return
        now = self.loop.time()
        for waiter in list(self._waiting):
            if waiter.deadline is None:
                waiter.deadline = now + self.wait_s
            elif now >= waiter.deadline:
                self._forget(waiter)
                waiter.future.set_exception(waiter.refuse(waiter.cost))
        if self._waiting and self._timer is None:
            first = min(w.deadline for w in self._waiting if w.deadline is not None)
            self._timer = self.loop.call_at(first, self._deadline)

    def _deadline(self) -> None:
        self._timer = None
        self._dispatch()
