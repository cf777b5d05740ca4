"""Handing memory back to the system after a burst: pool shrinking and ``malloc_trim``.

Freed Python objects go back to glibc's malloc, not to the kernel. glibc raises its mmap
threshold after the first large block is freed (up to 32 MiB, ``mallopt(3)``), so later
8 MiB messages and frame buffers come from the heap and its per-thread arenas; when the
burst ends those pages stay mapped ("glibc kept 2.2 GB after the burst", issue 12).
``malloc_trim(0)`` (glibc >= 2.8) returns every free page of every arena with
``MADV_DONTNEED`` — measured in docs/benchmarks.md, "Memory budget". Each server
process also fixes the threshold at ``server.mmap_threshold_bytes`` when it starts
(:func:`fix_mmap_threshold`), so large blocks never enter the heap at all.

:func:`keep_pool_trimmed` is the server's background task: once the decode pool has been
unused for ``decode.pool_idle_s`` after being used, it frees idle buffers beyond
``decode.pool_idle_bytes`` and trims the heap, once per quiet period.

:func:`freeze_startup_heap` runs once an engine is warm: the cyclic collector then never
walks the objects of the start-up (torch, the engine, the imports), only what serving made.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from functools import cache

from .buffers import BufferPool

log = logging.getLogger(__name__)


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    return libc


def malloc_trim() -> bool:
    """Return free heap memory to the system (glibc); False where that is not available.
    Blocking (it walks every arena): call it from a worker thread."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


#: ``mallopt(3)``'s parameter for the mmap threshold (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(nbytes: int) -> bool:
    """Serve every block of ``nbytes`` or more with its own mmap, and keep glibc from
    raising that threshold as big blocks are freed (``mallopt(M_MMAP_THRESHOLD)``); False
    where that is not available. A large message or frame is then given back to the
    system the moment it is freed, instead of staying in an arena's heap, so a burst of
    large messages peaks lower and leaves nothing to trim (``server.mmap_threshold_bytes``,
    measured in docs/benchmarks.md, "Memory budget"). Blocks under it (a 1280x720 JPEG,
    a 640x352 canvas) are untouched."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))


#: A node that never goes quiet still trims this often: a burst of big messages amid
#: steady traffic would otherwise keep its freed pages (measured in docs/benchmarks.md).
BUSY_TRIM_S = 30.0


async def keep_pool_trimmed(
    pool: BufferPool, idle_bytes: int, idle_s: float, trim_heap: bool = True
) -> None:
    """Forever: after each busy period, once the pool has been idle ``idle_s``, shrink it
    to ``idle_bytes`` and (``trim_heap``) trim the heap; while busy, trim the heap every
    :data:`BUSY_TRIM_S`. Checks every ``idle_s / 2``."""
    loop = asyncio.get_running_loop()
    handled: float | None = None  # the pool's last use when we last shrank it
    trimmed_at = loop.time()
    while True:
        await asyncio.sleep(idle_s / 2)
        if pool.idle_for() >= idle_s and pool.last_used != handled:
            handled = pool.last_used
            freed = pool.shrink(idle_bytes)
            log.debug("decode pool idle: freed %d bytes of idle buffers", freed)
        elif loop.time() - trimmed_at < BUSY_TRIM_S:
            continue
        trimmed_at = loop.time()
        await asyncio.to_thread(release_to_system, trim_heap)


def freeze_startup_heap() -> tuple[int, float]:
    """Collect once, then move every object alive now into the collector's permanent
    generation (``gc.freeze``): the imports, the engine, torch's modules. Returns how many
    objects were frozen and the milliseconds the collection took.

    Without it every full collection walks them all while holding the GIL: with torch
    loaded that is about 200,000 objects and 90-170 ms on the 2-core machine, a pause for
    every session of the worker, each :data:`BUSY_TRIM_S` and at each automatic full
    collection (measured in docs/benchmarks.md). Frozen objects are still freed when
    their last reference goes; only their reference cycles are never found, so this
    collects start-up's garbage first, and runs once a process (an engine swapped in later,
    after a fallback, is not frozen; the one it replaced keeps what it froze)."""
    t0 = time.perf_counter()
    gc.collect()
    ms = (time.perf_counter() - t0) * 1000
    gc.freeze()
    return gc.get_freeze_count(), ms


def tune_serving_process(mmap_threshold: int | None) -> None:
    """What holds for a whole serving process (a worker, a GPU process): glibc's mmap
    threshold (``server.mmap_threshold_bytes``; None leaves glibc's own)."""
    if mmap_threshold is not None and not fix_mmap_threshold(mmap_threshold):
        log.info("server.mmap_threshold_bytes: mallopt is not available here")


def settle_startup_heap() -> None:
    """Once a process's engine is warm, before it serves: :func:`freeze_startup_heap`,
    said in the log, so the collector's full passes no longer walk torch, the engine and
    the imports while holding the interpreter every frame of the process needs."""
    frozen, ms = freeze_startup_heap()
    log.info("%d start-up objects frozen for the collector (its pass took %.0f ms)", frozen, ms)


def release_to_system(trim_heap: bool = True) -> None:
    """Collect reference cycles, then (``trim_heap``) trim the heap. The collection
    matters: a closed connection's WebSocket reader and its partial-message buffer sit
    in a cycle, freed only when the cyclic collector runs, which it rarely does when
    few objects are made (measured: +461 MiB kept after a 60 s burst without it)."""
    gc.collect()
    if trim_heap:
        malloc_trim()
