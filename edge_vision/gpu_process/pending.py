"""The GPU process's queue: frames handed over by every worker and not yet decoding.

Pure, no I/O, tested with literal frames (tests/unit/test_gpu_process_queue.py). The rules:

* **Latest wins before any decode.** A frame sent with ``latest`` takes the place of its
  session's latest frame still waiting here, which :meth:`PendingQueue.add` returns so that
  the GPU process answers it as superseded: it is dropped and counted by its session's
  books in the worker, and never decoded. (A frame of the ``every`` mode is never
  replaced.)
* **Least recently served session first.** When more frames wait than the decoders take,
  the session (``owner``: worker and session) whose frame was taken longest ago goes
  first, its oldest frame first; a session never served goes before any served one. So a
  camera that floods has one frame waiting and a slow camera's frame still goes in the
  next batch, across every worker of the node (the engine's own batcher, frames/batch.py,
  keeps the same order for the frames once decoded).
* **A gone worker's frames go.** :meth:`PendingQueue.purge` takes every frame of the
  owners that match (the worker's connection closed): none is decoded for nobody.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Owners whose last turn is remembered (as frames/batch.py): one forgotten ranks as
#: served longest ago, which it was.
REMEMBERED_OWNERS = 4096


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    latest: bool


class PendingQueue(Generic[T]):
    """See the module docstring. Not thread-safe: the GPU process's event loop alone."""

    def __init__(self) -> None:
        self._items: dict[Hashable, deque[_Waiting[T]]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._token: dict[Hashable, int] = {}  # the owner's valid heap entry
        self._served: OrderedDict[Hashable, int] = OrderedDict()
        self._turns = 0
        self._order = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _enqueue_owner(self, owner: Hashable) -> None:
        token = next(self._order)
        self._token[owner] = token
        heapq.heappush(self._heap, (self._served.get(owner, -1), token, owner))

    def add(self, owner: Hashable, item: T, *, latest: bool) -> T | None:
        """Queue ``item`` for ``owner``; returns the latest frame it replaced, if any."""
        waiting = self._items.get(owner)
        if waiting is None:
            waiting = self._items[owner] = deque()
            self._enqueue_owner(owner)
        if latest:
            for w in waiting:
                if w.latest:  # the session's newest frame, in the older one's place
                    old, w.item = w.item, item
                    return old
        waiting.append(_Waiting(item, latest))
        self._count += 1
        return None

    def pop(self) -> tuple[Hashable, T] | None:
        """The next frame to decode (module docstring), with its owner; None when empty."""
        while self._heap:
            _served, token, owner = heapq.heappop(self._heap)
            if self._token.get(owner) != token:
                continue  # stale: the owner was served or emptied since
            waiting = self._items[owner]
            item = waiting.popleft().item
            self._count -= 1
            self._turns += 1
            self._served[owner] = self._turns
            self._served.move_to_end(owner)
            while len(self._served) > REMEMBERED_OWNERS:
                self._served.popitem(last=False)
            if waiting:
                self._enqueue_owner(owner)
            else:
                del self._items[owner]
                del self._token[owner]
            return owner, item
        return None

    def remove(self, owner: Hashable, item: T) -> bool:
        """Take ``item`` out (its worker cancelled it); False when it is not waiting."""
        waiting = self._items.get(owner)
        if waiting is None:
            return False
        for w in waiting:
            if w.item is item:
                waiting.remove(w)
                self._count -= 1
                if not waiting:
                    del self._items[owner]
                    del self._token[owner]
                return True
        return False

    def purge(self, match: Callable[[Hashable], bool]) -> list[T]:
        """Take out every frame of the owners ``match`` selects."""
        gone: list[T] = []
        for owner in [o for o in self._items if match(o)]:
            gone += [w.item for w in self._items.pop(owner)]
            del self._token[owner]
        self._count -= len(gone)
        return gone
