"""Reusable host buffers: the allocator type (numpy, or pinned memory from the CUDA layer)
and :class:`BufferPool`, the power-of-two pool that decode writes frames into, charged to the
memory budget."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import ClientError
from .budget import MemoryBudget

U8Array = npt.NDArray[np.uint8]


Allocator = Callable[[int], U8Array]


def numpy_allocator(nbytes: int) -> U8Array:
    return np.empty(nbytes, dtype=np.uint8)


class BufferPool:
    """Reusable flat uint8 buffers in power-of-two size classes, shared by worker threads.

    ``allocator`` decides what memory backs them: plain numpy, or pinned (page-locked)
    host memory from the CUDA layer so the H2D copy can be asynchronous.

    With a :class:`~edge_vision.common.budget.MemoryBudget` every buffer the pool owns, handed
    out or idle, is counted as ``pool`` bytes: a buffer that does not fit is refused with
    ``over_memory_budget``, and one given back while the budget is over its admission
    limit is freed rather than kept. :meth:`shrink` frees idle buffers down to a size
    (the server does so after ``decode.pool_idle_s`` without use).
    """

    def __init__(
        self,
        allocator: Allocator = numpy_allocator,
        keep_per_class: int = 256,
        budget: MemoryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allocator = allocator
        self._keep = keep_per_class
        self._free: dict[int, list[U8Array]] = {}
        self._out: dict[int, int] = {}  # id of each buffer handed out -> its size class
        self._lock = threading.Lock()
        self._budget = budget
        self._clock = clock
        self._last_used = clock()
        self.allocations = 0  # how many buffers were ever created (tests watch this)
        self.free_bytes = 0  # bytes idle in the free lists
        self.in_use_bytes = 0  # bytes handed out and not given back yet

    def set_allocator(self, allocator: Allocator) -> None:
        """Back new buffers with ``allocator`` (pinned when a CUDA engine takes over); the
        free lists are emptied so every buffer handed out from now on comes from it."""
        dropped = 0
        with self._lock:
            if allocator is not self._allocator:
                self._allocator = allocator
                dropped = self.free_bytes
                self._free.clear()
                self.free_bytes = 0
        self._uncharge(dropped)

    def _uncharge(self, nbytes: int) -> None:
        if self._budget is not None:
            self._budget.release(nbytes, "pool")

    @staticmethod
    def _size_class(nbytes: int) -> int:
        return 1 << max(12, (nbytes - 1).bit_length())

    def acquire(self, shape: tuple[int, ...]) -> U8Array:
        """A uint8 array of ``shape`` viewing a pooled buffer; give it back with release()."""
        nbytes = int(np.prod(shape))
        cls = self._size_class(nbytes)
        with self._lock:
            self._last_used = self._clock()
            free = self._free.get(cls)
            base = free.pop() if free else None
            if base is not None:
                self.free_bytes -= cls
            elif self._budget is not None and not self._budget.try_acquire(cls, "pool"):
                raise ClientError(
                    "over_memory_budget",
                    f"no room in the server's memory budget for a {cls}-byte frame buffer; "
                    "retry shortly",
                )
            else:
                self.allocations += 1
        if base is None:
            try:
                base = self._allocator(cls)
            except BaseException:
                self._uncharge(cls)
                raise
        with self._lock:
            self._out[id(base)] = cls
            self.in_use_bytes += cls
        return base[:nbytes].reshape(shape)

    def release(self, array: U8Array) -> None:
        base = array.base if array.base is not None else array
        # Views of views: walk to the pooled owner (a 1-D array of a size class).
        while isinstance(base, np.ndarray) and base.base is not None and base.ndim != 1:
            base = base.base
        if not isinstance(base, np.ndarray):
            return
        with self._lock:
            self._last_used = self._clock()
            cls = self._out.pop(id(base), None)
            if cls is None:  # not handed out by this pool (or already given back)
                return
            self.in_use_bytes -= cls
            free = self._free.setdefault(cls, [])
            over = self._budget is not None and self._budget.held > self._budget.admit_limit
            if len(free) < self._keep and not over:
                free.append(base)
                self.free_bytes += cls
                return
        self._uncharge(cls)  # freed, not kept: the budget is tight or the class is full

    @property
    def last_used(self) -> float:
        """When (the pool's clock) a buffer was last taken or given back."""
        return self._last_used

    def idle_for(self) -> float:
        """Seconds since a buffer was last taken or given back."""
        return self._clock() - self._last_used

    def shrink(self, keep_bytes: int) -> int:
        """Free idle buffers, largest first, until at most ``keep_bytes`` stay idle;
        returns the bytes freed."""
        freed = 0
        with self._lock:
            for cls in sorted(self._free, reverse=True):
                free = self._free[cls]
                while free and self.free_bytes > keep_bytes:
                    free.pop()
                    self.free_bytes -= cls
                    freed += cls
        self._uncharge(freed)
        return freed
