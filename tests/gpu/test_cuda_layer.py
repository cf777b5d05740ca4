"""The CUDA layer, identical tests for cuda-python and pycuda."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edge_vision.engines.cuda import CudaError, open_runtime


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


def test_an_event_completes_only_after_the_work_queued_before_it(backend: str) -> None:
    """What the engines' run threads rely on: query says not yet while a long copy runs,
    synchronise blocks until it is done, then query says done."""
    rt = open_runtime(backend)
    n = 1 << 30  # 1 GiB each way keeps the copy engines busy for a while
    try:
        host, dev = rt.alloc_pinned(n), rt.alloc_device(n)
        stream, event = rt.create_stream(), rt.create_event()
        for _ in range(4):
            rt.copy_htod_async(dev.ptr, host.array, stream)
            rt.copy_dtoh_async(host.array, dev.ptr, stream)
        rt.record(event, stream)
        assert not rt.query(event), "8 GiB of copies finished before query: proves nothing"
        t0 = time.perf_counter()
        rt.synchronize_event(event)
        waited = time.perf_counter() - t0
        assert waited > 0.05, f"synchronise returned after {waited * 1000:.1f} ms"
        assert rt.query(event)
        for r in (host, dev, stream, event):
            r.close()
    finally:
        rt.close()
