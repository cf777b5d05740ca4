"""The async shell between the server and the state store.

Frames never wait on the store. Connections only change in-memory :class:`Session`
objects; the keeper writes them out on a heartbeat (``state.heartbeat_s``) and promptly
after a connect or disconnect, so bursts of changes coalesce into one pipeline. While the
store is unreachable, writes are retried with exponential backoff, ``degraded`` is set (it
shows in /readyz and /metrics) and only a bounded set of final records waits; when the
store returns, the next flush rewrites the node and every live session, so state catches
up by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..aio import wait_event, with_timeout
from ..config import StateConfig
from ..errors import StateUnavailable
from ..metrics import Metrics
from ..session import Session, split_resume_token, token_matches
from .base import Record, StateStore

log = logging.getLogger(__name__)

T = TypeVar("T")
# Stores raise StateUnavailable; the keeper's own deadline raises TimeoutError.
STORE_ERRORS = (StateUnavailable, TimeoutError)
MAX_PENDING_FINALS = 10_000
_MIN_FLUSH_GAP_S = 0.05
_MAX_BACKOFF_S = 5.0


class StateKeeper:
    def __init__(
        self,
        store: StateStore,
        cfg: StateConfig,
        node_id: str,
        node_record: Callable[[], Record],
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.node_id = node_id
        self._node_record = node_record
        self._metrics = metrics
        self.live: dict[str, Session] = {}
        # Disconnected sessions whose final write has not reached the store yet.
        self._finals: OrderedDict[str, Record | None] = OrderedDict()
        self.degraded = False
        self.last_error: str | None = None
        self.last_flush: float | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._op(self.store.start())
        except STORE_ERRORS as e:  # a store failure only degrades state
            self._failed(e)
        self._task = asyncio.create_task(self._loop(), name="state-keeper")

    async def shutdown(self) -> None:
        """Final flush: live sessions become resumable, the node's keys are removed."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for session in list(self.live.values()):
            self.close_session(session, ended=False)
        await self.flush()
        try:
            await self._op(self.store.remove_node(self.node_id))
        except STORE_ERRORS as e:
            self._failed(e)
        await self.store.close()

    # -- what connections call --------------------------------------------------------

    def open_session(self, session: Session) -> None:
        session.connected = True
        session.node_id = self.node_id
        self._finals.pop(session.id, None)
        self.live[session.id] = session
        self._wake.set()

    def close_session(self, session: Session, *, ended: bool) -> None:
        """``ended``: the client closed normally (1000), so the session is deleted;
        otherwise it stays resumable for ``state.session_ttl_s``."""
        if self.live.get(session.id) is session:
            del self.live[session.id]
        session.connected = False
        session.last_seen = time.time()
        self._finals[session.id] = None if ended else session.to_record()
        self._finals.move_to_end(session.id)
        while len(self._finals) > MAX_PENDING_FINALS:
            self._finals.popitem(last=False)
        self._wake.set()

    async def find_resumable(self, token: str) -> Session | None:
        """The session a resume token names, from this node or the shared store."""
        parts = split_resume_token(token)
        if parts is None:
            return None
        sid, secret = parts
        session = self.live.get(sid)
        if session is None:
            rec = self._finals.get(sid)
            if rec is None:
                try:
                    rec = await self._op(self.store.get_session(sid))
                except STORE_ERRORS as e:
                    self._failed(e)
                    rec = None
            session = Session.from_record(rec) if rec else None
        if session is None or not token_matches(session, secret):
            return None
        return session

    async def list_sessions(self) -> tuple[list[dict[str, Any]], bool]:
        """All sessions the store knows (across nodes); ``False`` when only local ones."""
        try:
            records = await self._op(self.store.list_sessions())
        except STORE_ERRORS as e:
            self._failed(e)
            return [s.public() for s in self.live.values()], False
        merged = {r["id"]: Session.from_record(r) for r in records if "id" in r}
        merged.update(self.live)  # this node's own view is the freshest
        return [s.public() for s in merged.values()], True

    async def list_nodes(self) -> tuple[list[Record], bool]:
        try:
            return await self._op(self.store.list_nodes()), True
        except STORE_ERRORS as e:
            self._failed(e)
            return [self._node_record()], False

    # -- flushing ---------------------------------------------------------------------

    async def _op(self, aw: Awaitable[T]) -> T:
        return await with_timeout(aw, self.cfg.op_timeout_s)

    def _failed(self, e: BaseException) -> None:
        if not self.degraded:
            log.warning(
                "state store %s unreachable (%s); frames keep flowing",
                self.store.kind,
                e or type(e).__name__,
            )
        self.degraded = True
        self.last_error = str(e) or type(e).__name__
        if self._metrics is not None:
            self._metrics.state_write_failures.inc()
            self._metrics.state_degraded.set(1)

    async def flush(self) -> bool:
        """Write node, live sessions and pending finals; False when the store failed."""
        now = time.time()
        for s in self.live.values():
            s.last_seen = max(s.last_seen, now) if s.connected else s.last_seen
        try:
            await self._op(
                self.store.write_node(self.node_id, self._node_record(), self.cfg.node_ttl_s)
            )
            await self._op(
                self.store.write_sessions(
                    self.node_id,
                    [s.to_record() for s in self.live.values()],
                    self.cfg.session_ttl_s,
                    self.cfg.node_ttl_s,
                )
            )
            while self._finals:
                sid, rec = next(iter(self._finals.items()))
                if rec is None:
                    await self._op(self.store.end_session(self.node_id, sid))
                else:
                    await self._op(
                        self.store.release_session(self.node_id, rec, self.cfg.session_ttl_s)
                    )
                if self._finals.get(sid) is rec:
                    del self._finals[sid]
        except STORE_ERRORS as e:
            self._failed(e)
            return False
        if self.degraded:
            log.info("state store %s reachable again; state rewritten", self.store.kind)
        self.degraded = False
        self.last_error = None
        self.last_flush = time.time()
        if self._metrics is not None:
            self._metrics.state_degraded.set(0)
        return True

    async def _loop(self) -> None:
        backoff = 0.0
        while True:
            if backoff:  # store down: retry on the backoff schedule, not on every change
                await asyncio.sleep(backoff)
            else:
                await wait_event(self._wake, self.cfg.heartbeat_s)
            self._wake.clear()
            if await self.flush():
                backoff = 0.0
                await asyncio.sleep(_MIN_FLUSH_GAP_S)  # coalesce bursts of connects
            else:
                backoff = min(_MAX_BACKOFF_S, max(0.25, backoff * 2))
