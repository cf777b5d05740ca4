"""One sink's outbox: the events it has not taken yet, in order, bounded.

Events wait here from the moment a rule raises them until their sink takes them, so a
sink that is down (a broker restarting, a webhook receiver away) loses nothing it can
hold: the outbox keeps up to ``events.outbox_max`` events per sink, and when it is full
the oldest go to make room, each counted (``edge_vision_events_dropped_total{reason=
"outbox_full"}``) and logged, never silently.

Held in memory; with ``events.outbox_dir`` set, also written to a SQLite file there
(``outbox.sqlite``, one table per sink), so what a sink had not taken when the service
stopped is delivered after it starts again. Every SQLite call runs in one worker thread
of the outbox, in order, never on the event loop; the journal is WAL with
``synchronous=NORMAL``: an event is on disk a few milliseconds after it was raised, and
a crash of the machine (not of the process) may lose the last of them.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..common.threads import role_pool

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Queued:
    """One event waiting for its sink."""

    seq: int  # the outbox's own order, from 1
    rule: str
    at: float  # when the rule fired (Unix seconds): delivery latency counts from here
    body: bytes  # the event's JSON


class OutboxStore:
    """The SQLite file under ``events.outbox_dir`` that the node's outboxes share, one
    table per sink. Every call runs in its one thread, in the order made."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / "outbox.sqlite"
        self._pool: ThreadPoolExecutor = role_pool(1, "outbox")
        self._db: sqlite3.Connection | None = None
        self._writes: set[asyncio.Future[Any]] = set()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` in the store's thread after what was submitted before; a failure
        is logged (the event stays in memory, only its copy on disk is missing)."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        self._writes.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[Any]) -> None:
        self._writes.discard(future)
        if not future.cancelled() and (e := future.exception()) is not None:
            log.warning("the events outbox could not write to %s: %s", self.path, e)

    async def flush(self) -> None:
        """Until everything submitted so far is on disk."""
        await self.call(lambda: None)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        self._db = db

    async def open(self) -> None:
        await self.call(self._open)

    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the outbox store is not open")
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def close(self) -> None:
        await self.call(self._close)
        await asyncio.to_thread(self._pool.shutdown, True)


class Outbox:
    """The events one sink has not taken, oldest first (see the module docstring)."""

    def __init__(self, sink: str, max_events: int, store: OutboxStore | None = None) -> None:
        self.sink = sink
        self.max_events = max_events
        self._store = store
        self._table = f'"outbox_{sink}"'
        self._queue: deque[Queued] = deque()
        self._next = 1
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._queue)

    async def open(self) -> int:
        """Load what an earlier run left (with a store); the number of events found."""
        if self._store is None:
            return 0
        rows = await self._store.call(self._load)
        self._queue.extend(Queued(seq, rule, at, body) for seq, rule, at, body in rows)
        if self._queue:
            self._next = self._queue[-1].seq + 1
            self._ready.set()
            self._empty.clear()
        return len(rows)

    def _load(self) -> list[tuple[int, str, float, bytes]]:
        db = self._store.db() if self._store is not None else None
        if db is None:
            return []
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {self._table} "
            "(seq INTEGER PRIMARY KEY, rule TEXT NOT NULL, at REAL NOT NULL, body BLOB NOT NULL)"
        )
        rows = db.execute(f"SELECT seq, rule, at, body FROM {self._table} ORDER BY seq")
        return [(int(s), str(r), float(a), bytes(b)) for s, r, a, b in rows]

    def put(self, rule: str, at: float, body: bytes) -> list[Queued]:
        """Queue one event; returns the events dropped to make room (oldest first). Never
        blocks: the disk write (with a store) follows in the outbox's thread."""
        item = Queued(self._next, rule, at, body)
        self._next += 1
        self._queue.append(item)
        dropped = []
        while len(self._queue) > self.max_events:
            dropped.append(self._queue.popleft())
        if self._store is not None:
            self._store.submit(self._write, item, [d.seq for d in dropped])
        self._ready.set()
        self._empty.clear()
        return dropped

    def _write(self, item: Queued, dropped: list[int]) -> None:
        db = self._store.db() if self._store is not None else None
        if db is None:
            return
        with db:
            db.execute(
                f"INSERT INTO {self._table} (seq, rule, at, body) VALUES (?, ?, ?, ?)",
                (item.seq, item.rule, item.at, item.body),
            )
            if dropped:
                db.executemany(f"DELETE FROM {self._table} WHERE seq = ?", [(s,) for s in dropped])

    def peek(self, n: int) -> list[Queued]:
        """The ``n`` oldest events, left in place until :meth:`done`."""
        return [self._queue[i] for i in range(min(n, len(self._queue)))]

    def done(self, items: Iterable[Queued]) -> None:
        """These events (the oldest, from :meth:`peek`) were taken by the sink, or dropped
        for good: they leave the outbox."""
        seqs = {i.seq for i in items}
        while self._queue and self._queue[0].seq in seqs:
            self._queue.popleft()
        if not self._queue:
            self._ready.clear()
            self._empty.set()
        if self._store is not None and seqs:
            self._store.submit(self._delete, max(seqs))

    def _delete(self, upto: int) -> None:
        db = self._store.db() if self._store is not None else None
        if db is not None:
            with db:
                db.execute(f"DELETE FROM {self._table} WHERE seq <= ?", (upto,))

    async def wait(self) -> None:
        """Until an event waits."""
        await self._ready.wait()

    async def wait_empty(self) -> None:
        """Until the sink took every event."""
        await self._empty.wait()
