"""The hand-off ring between a worker and its GPU process: frames placed and read back
whole, space coming back as the GPU process answers, a full ring said at once, a torn or
reused record never read, and a segment no other user can read that leaves no name behind."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from edge_vision.errors import ConfigError
from edge_vision.gpu_process.ring import (
    PREFIX,
    RECORD_HEADER,
    SEGMENT_HEADER_BYTES,
    RingReader,
    RingWriter,
    Segment,
    record_bytes,
    segment_name,
    sweep_stale,
)


def frame(i: int, size: int = 100) -> bytes:
    return bytes((i + j) % 256 for j in range(size))


@pytest.fixture
def ring(tmp_path: Path) -> RingWriter:
    # 8 records of a 100-byte frame (128 ring bytes each)
    return RingWriter(Segment.create("node-a", "w0", 8 * record_bytes(100), tmp_path))


def test_frames_come_back_whole_and_the_ring_wraps_around(ring: RingWriter) -> None:
    reader = RingReader(ring.segment)
    records = [ring.put(frame(i), i) for i in range(8)]
    assert all(r is not None for r in records)
    assert ring.put(frame(8), 8) is None  # full: the caller tells the sender or waits
    for r in records[:2]:
        assert r is not None
        ring.free(r)
    wrapped = ring.put(frame(9), 9)
    assert wrapped is not None and wrapped.offset == 0  # around to the start
    assert reader.read(wrapped) == frame(9)
    for i, r in enumerate(records[2:], start=2):
        assert r is not None and reader.read(r) == frame(i)


def test_space_comes_back_from_the_oldest_record_whatever_the_order_answers_come(
    ring: RingWriter,
) -> None:
    records = [ring.put(frame(i), i) for i in range(8)]
    middle = records[3]
    assert middle is not None
    ring.free(middle)  # answered first, but older frames still lie before it
    assert ring.put(frame(8), 8) is None
    first = records[0]
    assert first is not None
    ring.free(first)
    assert ring.put(frame(8), 8) is not None
    for r in records:
        if r is not None:
            ring.free(r)
    ring.free(records[1])  # type: ignore[arg-type]  # a second free is a no-op
    assert ring.used_bytes > 0  # the frame put above is still in the ring
    assert ring.records == 1


def test_a_frame_larger_than_the_ring_never_fits(ring: RingWriter) -> None:
    assert not ring.fits_ever(ring.capacity)
    assert ring.put(bytes(ring.capacity), 0) is None
    assert ring.fits_ever(100)


def test_a_torn_or_reused_record_is_never_read(ring: RingWriter) -> None:
    reader = RingReader(ring.segment)
    first = ring.put(frame(1), 1)
    assert first is not None and reader.read(first) == frame(1)
    # A writer that died mid-write leaves the stamp at 0 (written first, set last).
    RECORD_HEADER.pack_into(ring.segment.map, SEGMENT_HEADER_BYTES + first.offset, 0, 0, 0)
    assert reader.read(first) is None
    ring.free(first)
    again = ring.put(frame(2), 2)  # the same place, a new stamp
    assert again is not None and again.offset == first.offset
    assert reader.read(first) is None  # the old submit names the old stamp
    assert reader.read(again) == frame(2)
    beyond = type(again)(ring.capacity, 10, again.stamp)
    assert reader.read(beyond) is None  # outside the ring


def test_the_segment_is_the_service_users_alone_and_leaves_no_name(tmp_path: Path) -> None:
    os.umask(old := os.umask(0))  # the widest umask: the mode must still be 0600
    try:
        segment = Segment.create("node-a", "w3", 4096, tmp_path)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.fstat(segment.fd).st_mode) == 0o600
        assert list(tmp_path.iterdir()) == []  # unlinked once held: nothing to leak
        attached = Segment.attach(os.dup(segment.fd))  # what the GPU process maps
        try:
            assert attached.data_bytes == segment.data_bytes
            with pytest.raises(TypeError):  # read-only on the GPU process's side
                attached.map[0:1] = b"x"
        finally:
            attached.close()
    finally:
        segment.close()


def test_the_gpu_process_refuses_a_descriptor_that_is_not_a_ring(tmp_path: Path) -> None:
    path = tmp_path / "other"
    path.write_bytes(bytes(4096))
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(ValueError, match="not a hand-off ring"):
        Segment.attach(fd)
    os.close(fd)


def test_dev_shm_too_small_says_shm_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(ConfigError, match="shm_size"):
        Segment.create("node-a", "w0", 1 << 20, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_creators_name_is_swept_at_the_next_start(tmp_path: Path) -> None:
    dead = tmp_path / segment_name("node-a", "w0", pid=2**31 - 1)  # no such process
    alive = tmp_path / segment_name("node-a", "w1")  # this process
    other = tmp_path / segment_name("node-b", "w0", pid=2**31 - 1)
    for p in (dead, alive, other):
        p.write_bytes(b"")
    assert sweep_stale("node-a", tmp_path) == [dead.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])
    assert all(p.name.startswith(PREFIX) for p in tmp_path.iterdir())
