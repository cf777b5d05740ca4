"""The CUDA layer, identical tests for cuda-python and pycuda."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from edge_vision.cuda import CudaError, open_runtime


def test_pinned_buffer_is_a_numpy_view_without_copies(backend: str) -> None:
    rt = open_runtime(backend)
    try:
        buf = rt.alloc_pinned(1 << 20)
        view = buf.view(np.float32, (256, 1024))
        view[:] = 3.0
        assert np.shares_memory(view, buf.array)
        assert buf.array.view(np.float32)[0] == 3.0
        buf.close()
        buf.close()  # closing twice is harmless
    finally:
        rt.close()


def test_async_round_trip_through_device_memory_on_a_stream(backend: str) -> None:
    rt = open_runtime(backend)
    try:
        src = rt.alloc_pinned(4 << 20)
        dst = rt.alloc_pinned(4 << 20)
        dev = rt.alloc_device(4 << 20)
        stream, event = rt.create_stream(), rt.create_event()
        src.array[:] = np.arange(src.nbytes, dtype=np.uint64).astype(np.uint8)
        rt.copy_htod_async(dev.ptr, src.array, stream)
        rt.copy_dtoh_async(dst.array, dev.ptr, stream)
        rt.record(event, stream)
        rt.synchronize_event(event)
        assert rt.query(event)
        np.testing.assert_array_equal(dst.array, src.array)
        for r in (src, dst, dev, stream, event):
            r.close()
    finally:
        rt.close()


def test_cuda_errors_name_the_call(backend: str) -> None:
    rt = open_runtime(backend)
    try:
        with pytest.raises(CudaError, match=r"(?i)alloc"):
            rt.alloc_device(1 << 50)  # a petabyte
    finally:
        rt.close()


async def test_waiting_for_the_gpu_never_blocks_the_event_loop(backend: str) -> None:
    """While a long copy runs, the loop keeps ticking every few ms."""
    rt = await asyncio.to_thread(open_runtime, backend)
    n = 1 << 30  # 1 GiB each way keeps the copy engines busy for a while

    def setup() -> tuple[Any, ...]:
        host, dev = rt.alloc_pinned(n), rt.alloc_device(n)
        stream, event = rt.create_stream(), rt.create_event()
        for _ in range(4):
            rt.copy_htod_async(dev.ptr, host.array, stream)
            rt.copy_dtoh_async(host.array, dev.ptr, stream)
        rt.record(event, stream)
        return host, dev, stream, event

    try:
        resources = await asyncio.to_thread(setup)
        event = resources[3]
        ticks: list[float] = []
        stop = False

        async def ticker() -> None:
            while not stop:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        t0 = time.perf_counter()
        await rt.wait(event)
        waited = time.perf_counter() - t0
        stop = True
        await t
        gaps = np.diff(ticks) * 1000
        assert waited > 0.05, "the copy was too short to prove anything"
        assert len(ticks) > 10 and gaps.max() < 20, f"loop stalled {gaps.max():.1f} ms"
        for r in resources:
            r.close()
    finally:
        rt.close()
