"""The bounded ring through which one worker hands compressed frames to the GPU process.

One shared-memory segment a worker (:class:`Segment`): created under a name of the node
and the worker in ``/dev/shm`` with mode 0600 (owned by the service user, readable by no
other), its pages reserved at once (``posix_fallocate``: a ``/dev/shm`` too small for it,
Docker's 64 MiB default, is one start-up error naming ``shm_size`` instead of a SIGBUS
later), and its name unlinked as soon as the worker holds it. The GPU process gets the
segment as a file descriptor over its control socket (SCM_RIGHTS) and maps it read-only.
So no name is left to clean up after a SIGKILL of either side: the kernel frees the pages
when the last process holding them is gone. (:func:`sweep_stale` removes what a process
killed between the create and the unlink left, at the next start.)

:class:`RingWriter` (the worker's event loop, the only writer) places each frame as one
record at the head of a circular byte area: a 16-byte header (``stamp``, length, the
frame's sequence number) and the JPEG or PNG bytes, 64-byte aligned. A record is freed
when the GPU process has answered its frame (it no longer reads it), in any order; the
space comes back in ring order, from the oldest record. ``put`` returns None when the
frame does not fit now (the ring is full: the caller tells the sender or waits).

:class:`RingReader` (the GPU process) copies a record's bytes out, and reads a record only
when its header carries the stamp and length its submit message named, both before and
after the copy: a record being written (its stamp is written last, after a zero), reused,
or torn by a writer that died mid-write is never read (:meth:`RingReader.read` returns
None). The submit message itself goes over a socket after the bytes are in place, so the
GPU process never sees a record before it is complete.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

#: Where POSIX shared memory lives on Linux (what shm_open uses).
SHM_DIR = Path("/dev/shm")
#: Every segment's name starts with this, then the node's name.
PREFIX = "edge-vision-"
MAGIC = b"EVRING01"
#: The segment's own header: magic, then the data area's size.
_SEGMENT_HEADER = struct.Struct("<8sQ")
SEGMENT_HEADER_BYTES = 64
#: A record's header: stamp (written last; 0 while writing), payload length, frame seq.
RECORD_HEADER = struct.Struct("<IIQ")
ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def record_bytes(length: int) -> int:
    """Ring bytes a frame of ``length`` bytes takes."""
    return _aligned(RECORD_HEADER.size + length)


def safe_name(node: str) -> str:
    """``node`` as a file-name part: letters, digits, '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", node)[:64] or "node"


def segment_name(node: str, label: str, pid: int | None = None) -> str:
    """``edge-vision-<node>-<label>-<pid>``: whose segment it is, and which process made it."""
    return f"{PREFIX}{safe_name(node)}-{safe_name(label)}-{os.getpid() if pid is None else pid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def sweep_stale(node: str, directory: Path = SHM_DIR) -> list[str]:
    """Remove this node's segment names whose creating process is gone (a kill between
    the create and the unlink); returns the names removed."""
    removed: list[str] = []
    prefix = f"{PREFIX}{safe_name(node)}-"
    try:
        names = [p.name for p in directory.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                (directory / name).unlink()
                removed.append(name)
            except OSError:
                pass
    return removed


class Segment:
    """A mapped shared-memory segment and its file descriptor (module docstring)."""

    def __init__(self, fd: int, size: int, name: str, *, writable: bool) -> None:
        self.fd = fd
        self.size = size
        self.name = name
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.map = mmap.mmap(fd, size, access=access)

    @classmethod
    def create(cls, node: str, label: str, data_bytes: int, directory: Path = SHM_DIR) -> Segment:
        """A new segment of ``data_bytes`` for frames, mode 0600, its name already gone."""
        size = SEGMENT_HEADER_BYTES + _aligned(data_bytes)
        name = segment_name(node, label)
        path = directory / name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as e:
            raise ConfigError(f"server.gpu_process: cannot create {path}: {e.strerror}") from e
        try:
            os.fchmod(fd, 0o600)  # whatever the umask: the service user's alone
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # not tmpfs: sized, unreserved
                    os.ftruncate(fd, size)
                elif e.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise
                else:
                    raise ConfigError(
                        f"server.gpu_process: {directory} has no room for a worker's "
                        f"{size / 2**20:.0f} MiB hand-off ring; give it more (a container's "
                        "shm_size, deploy/compose) or lower server.max_message_bytes"
                    ) from None
            segment = cls(fd, size, name, writable=True)
        except BaseException:
            os.close(fd)
            raise
        finally:
            path.unlink(missing_ok=True)  # no name to leak, whoever is killed later
        _SEGMENT_HEADER.pack_into(segment.map, 0, MAGIC, size - SEGMENT_HEADER_BYTES)
        return segment

    @classmethod
    def attach(cls, fd: int, name: str = "") -> Segment:
        """The segment behind ``fd`` (handed over by its worker), mapped read-only; raises
        ValueError when it is not a ring (``fd`` is then still the caller's)."""
        size = os.fstat(fd).st_size
        if size < SEGMENT_HEADER_BYTES:
            raise ValueError("not a hand-off ring: too small")
        segment = cls(fd, size, name, writable=False)
        magic, data = _SEGMENT_HEADER.unpack_from(segment.map, 0)
        if magic != MAGIC or data != size - SEGMENT_HEADER_BYTES:
            segment.map.close()  # the descriptor stays the caller's to close
            raise ValueError("not a hand-off ring: wrong header")
        return segment

    @property
    def data_bytes(self) -> int:
        return self.size - SEGMENT_HEADER_BYTES

    def close(self) -> None:
        if not self.map.closed:
            self.map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True, slots=True)
class Record:
    """Where one frame lies in the ring: what a submit message names."""

    offset: int  # of its header, from the data area's start
    length: int  # payload bytes
    stamp: int  # unique among the ring's live records; never 0


@dataclass(slots=True)
class _Slot:
    record: Record
    end: int  # offset just past the record
    freed: bool = field(default=False)


class RingWriter:
    """The worker's side: places frames, frees them in any order (module docstring).

    Not thread-safe: the worker's event loop alone calls it."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.capacity = segment.data_bytes
        self._live: deque[_Slot] = deque()
        self._by_stamp: dict[int, _Slot] = {}
        self._head = 0
        self._stamps = itertools.count(1)

    @property
    def records(self) -> int:
        """Records not freed yet, or freed but behind an older live one."""
        return len(self._live)

    @property
    def used_bytes(self) -> int:
        """Bytes between the oldest live record and the head, wrap-around included."""
        if not self._live:
            return 0
        tail = self._live[0].record.offset
        if self._head > tail:
            return self._head - tail
        return self.capacity - tail + self._head

    def fits_ever(self, length: int) -> bool:
        return record_bytes(length) <= self.capacity

    def _place(self, size: int) -> int | None:
        if not self._live:
            self._head = 0
            return 0 if size <= self.capacity else None
        tail = self._live[0].record.offset
        head = self._head
        if head > tail:  # live records are [tail, head): room after head, or before tail
            if head + size <= self.capacity:
                return head
            return 0 if size <= tail else None
        return head if head + size <= tail else None  # wrapped: room is [head, tail)

    def put(self, data: bytes | memoryview, seq: int) -> Record | None:
        """Write ``data`` as a new record; None when it does not fit now."""
        size = record_bytes(len(data))
        at = self._place(size)
        if at is None:
            return None
        stamp = next(self._stamps) & 0xFFFFFFFF or next(self._stamps)
        buf = self.segment.map
        base = SEGMENT_HEADER_BYTES + at
        RECORD_HEADER.pack_into(buf, base, 0, 0, 0)  # not a record until its stamp is in
        body = base + RECORD_HEADER.size
        buf[body : body + len(data)] = data
        RECORD_HEADER.pack_into(buf, base, stamp, len(data), seq)
        record = Record(at, len(data), stamp)
        slot = _Slot(record, at + size)
        self._live.append(slot)
        self._by_stamp[stamp] = slot
        self._head = at + size
        return record

    def free(self, record: Record) -> None:
        """The GPU process no longer reads ``record``; a second free is a no-op."""
        slot = self._by_stamp.pop(record.stamp, None)
        if slot is None:
            return
        slot.freed = True
        while self._live and self._live[0].freed:
            self._live.popleft()
        if not self._live:
            self._head = 0


class RingReader:
    """The GPU process's side: a record's bytes, or None where it is not whole."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment

    def _header_matches(self, record: Record) -> bool:
        if record.offset < 0 or record.offset + record_bytes(record.length) > (
            self.segment.data_bytes
        ):
            return False
        stamp, length, _seq = RECORD_HEADER.unpack_from(
            self.segment.map, SEGMENT_HEADER_BYTES + record.offset
        )
        return bool(stamp == record.stamp and length == record.length)

    def read(self, record: Record) -> bytes | None:
        if not self._header_matches(record):
            return None
        body = SEGMENT_HEADER_BYTES + record.offset + RECORD_HEADER.size
        data = self.segment.map[body : body + record.length]
        return data if self._header_matches(record) else None
