"""The async shell between the server and the state store (docs/state.md).

Frames never wait on the store. Connections only change in-memory :class:`Session`
objects; the keeper writes them out:

* every ``state.heartbeat_s``: the node record and every live session (this refreshes
  their TTLs), and
* promptly (coalesced, at most every 50 ms) after a connect, resume or disconnect: the
  node record, the new sessions and the final records of closed ones.

While the store is unreachable (or slower than ``state.op_timeout_s``) writes fail fast,
``degraded`` is set (shown by /readyz and the ``edge_vision_state_degraded`` metric), each
failed flush counts in ``edge_vision_state_write_failures``, and the keeper retries with
exponential backoff up to ``state.heartbeat_s`` or 2 s, whichever is shorter. Nothing
queues per frame or per heartbeat: live sessions are rewritten from their current values,
and only the final record of each closed session waits (bounded, newest kept). The first
flush after the store returns is a full one, so the node, every live session and every
release catch up by themselves.

Disconnected sessions are also kept here for ``state.session_ttl_s`` (bounded), so a
client reconnecting to the same node resumes even while Redis is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..common.aio import cancel_and_wait, wait_event, with_timeout
from ..common.metrics import Metrics
from ..config import StateConfig
from ..errors import StateUnavailable
from ..session.record import Session, split_resume_token, token_matches
from .base import Record, SessionWrite, StateStore, WriteKind

log = logging.getLogger(__name__)

T = TypeVar("T")
# Stores raise StateUnavailable; the keeper's own deadline raises TimeoutError.
STORE_ERRORS = (StateUnavailable, TimeoutError)
#: Final records of closed sessions waiting for the store; beyond this the oldest go
#: (their store records still expire by TTL, so nothing is left behind for ever).
MAX_PENDING_FINALS = 10_000
#: Disconnected sessions remembered in this process for resume without the store.
MAX_RECENT = 4096
#: Longest a resume waits for the previous node's final record (see _await_release).
HANDOVER_WAIT_S = 1.0
_HANDOVER_POLL_S = 0.02
_MIN_FLUSH_GAP_S = 0.05
_FIRST_BACKOFF_S = 0.1
#: Retry at least this often while the store is down (a failed connect costs nothing),
#: so state is rewritten within about this long after Redis returns.
_MAX_BACKOFF_S = 2.0

_NODE_NUMBERS = {"started": float, "heartbeat": float}
_NODE_INTEGERS = ("connections", "in_flight", "max_connections", "protocol")


@dataclass(frozen=True, slots=True)
class _Final:
    """The last word on a closed session, waiting for the store."""

    kind: WriteKind  # "released" or "ended"
    epoch: int
    record: Record
    closed_at: float  # time.monotonic()


def node_public(rec: Record) -> dict[str, Any]:
    """A node record with JSON types, for the admin API."""
    out: dict[str, Any] = dict(rec)
    for k, conv in _NODE_NUMBERS.items():
        if k in rec:
            try:
                out[k] = conv(rec[k])
            except ValueError:
                pass
    for k in _NODE_INTEGERS:
        if rec.get(k, "").isdigit():
            out[k] = int(rec[k])
    if "degraded" in rec:
        out["degraded"] = rec["degraded"] == "1"
    return out


class StateKeeper:
    def __init__(
        self,
        store: StateStore,
        cfg: StateConfig,
        node_id: str,
        node_record: Callable[[], Record],
        metrics: Metrics | None = None,
        on_superseded: Callable[[str], None] | None = None,
    ) -> None:
        """``on_superseded(session_id)`` is called when the store reports that a newer
        connection (on another node) resumed a session this node still serves."""
        self.store = store
        self.cfg = cfg
        self.node_id = node_id
        self._node_record = node_record
        self._metrics = metrics
        self._on_superseded = on_superseded
        self.live: dict[str, Session] = {}
        self._dirty: set[str] = set()
        self._finals: OrderedDict[str, _Final] = OrderedDict()
        self._recent: OrderedDict[str, tuple[Session, float]] = OrderedDict()
        self._need_full = True
        self.degraded = False
        self.last_error: str | None = None
        self.last_flush: float | None = None  # time.time() of the last successful flush
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._op(self.store.start())
        except STORE_ERRORS as e:  # a store failure only degrades state
            self._failed(e, write=False)
        self._task = asyncio.create_task(self._loop(), name="state-keeper")

    async def hand_over(self) -> None:
        """Before sockets close for shutdown: write every live session as released, so a
        client that resumes on another node at once finds its latest counters there."""
        sessions = list(self.live.values())
        for session in sessions:
            self.close_session(session, ended=False)
        ok = await self.flush(full=True)
        log.info("handed %d sessions over%s", len(sessions), "" if ok else " (store unreachable)")

    async def shutdown(self) -> None:
        """Final flush: live sessions become resumable, the node's keys are removed."""
        await cancel_and_wait(self._task)
        self._task = None
        for session in list(self.live.values()):
            self.close_session(session, ended=False)
        await self.flush(full=True)
        try:
            await self._op(self.store.remove_node(self.node_id))
            log.info("node %s removed from the %s state store", self.node_id, self.store.kind)
        except STORE_ERRORS as e:
            self._failed(e)
        await self.store.close()

    def status(self) -> dict[str, Any]:
        """For /readyz: state trouble is shown here and never makes the node unready."""
        age = None if self.last_flush is None else round(time.time() - self.last_flush, 3)
        return {
            "store": self.store.kind,
            "degraded": self.degraded,
            "error": self.last_error,
            "last_write_age_s": age,
            "pending_finals": len(self._finals),
        }

    # -- what connections call --------------------------------------------------------

    def open_session(self, session: Session) -> None:
        now = time.time()
        session.connected = True
        session.node_id = self.node_id
        session.connected_at = now
        session.last_seen = now
        self._finals.pop(session.id, None)
        self._recent.pop(session.id, None)
        self.live[session.id] = session
        self._dirty.add(session.id)
        self._wake.set()

    def touch(self, session: Session) -> None:
        """The session's settings changed: write it promptly rather than at the next
        heartbeat, so a resume on another node finds them even if this node dies."""
        if self.live.get(session.id) is session:
            self._dirty.add(session.id)
            self._wake.set()

    async def write_now(self, session: Session) -> None:
        """Write ``session`` to the store and wait for it: a protocol 3 resume's new token
        hash is there before the connection reads on, so no other node takes the old token
        or refuses the new one once the client has it. A store known to be down is not
        waited for: the loop writes it when the store is back."""
        self.touch(session)
        if not self.degraded:
            await self.flush(full=False)

    def close_session(self, session: Session, *, ended: bool) -> None:
        """``ended``: the client closed normally (1000), so the session is deleted;
        otherwise it stays resumable for ``state.session_ttl_s``."""
        current = self.live.get(session.id)
        if current is not None and current is not session:
            return  # a newer connection on this node holds the session now
        self.live.pop(session.id, None)
        session.connected = False
        session.last_seen = time.time()
        now = time.monotonic()
        if ended:
            final = _Final("ended", session.epoch, {}, now)
            self._recent.pop(session.id, None)
        else:
            final = _Final("released", session.epoch, session.to_record(), now)
            self._recent[session.id] = (session, now)
            self._recent.move_to_end(session.id)
            while len(self._recent) > MAX_RECENT:
                self._recent.popitem(last=False)
        self._finals[session.id] = final
        self._finals.move_to_end(session.id)
        while len(self._finals) > MAX_PENDING_FINALS:
            self._finals.popitem(last=False)
        self._wake.set()

    async def still_released(self, session: Session) -> bool:
        """No connection holds ``session`` now: not one of this node's, and not a newer
        one elsewhere as far as the store says (unreachable: True, this node's view)."""
        if session.id in self.live:
            return False
        try:
            rec = await self._op(self.store.get_session(session.id))
        except STORE_ERRORS as e:
            self._failed(e, write=False)
            return True
        if rec is None:
            return True  # ended or expired: nobody holds it
        try:
            epoch = int(rec.get("epoch", "0"))
        except ValueError:
            return True
        return epoch <= session.epoch and rec.get("connected") != "1"

    def _recent_session(self, session_id: str) -> Session | None:
        entry = self._recent.get(session_id)
        if entry is None:
            return None
        if time.monotonic() - entry[1] >= self.cfg.session_ttl_s:
            del self._recent[session_id]
            return None
        return entry[0]

    async def find_resumable(self, token: str) -> Session | None:
        """The session a resume token names, claimed for this node; None if unknown,
        expired, ended, claimed by someone else first, or the secret does not match.

        The newest of this node's copy and the store's record wins (by epoch). A store
        record is claimed atomically (:meth:`StateStore.claim_session`), so two nodes
        resuming one token at once cannot both get it."""
        parts = split_resume_token(token)
        if parts is None:
            return None
        sid, secret = parts
        final = self._finals.get(sid)
        if final is not None and final.kind == "ended":
            return None
        mine = self.live.get(sid) or self._recent_session(sid)
        local = mine if mine is not None and token_matches(mine, secret) else None
        stored: Session | None = None
        try:
            rec = await self._op(self.store.get_session(sid))
        except STORE_ERRORS as e:
            self._failed(e, write=False)
            rec = None
        if rec is not None:
            try:
                stored = Session.from_record(rec)
            except ValueError as e:
                log.warning("ignoring unreadable session record %s: %s", sid, e)
        if stored is not None and mine is not None and mine.epoch >= stored.epoch:
            # This node's copy is as new as the store's and knows the newest secret (a
            # protocol 3 resume rotates it here before the store has the new hash): its
            # secret decides, checked before anything else is done for this token.
            if local is None:
                return None
        elif stored is not None and not token_matches(stored, secret):
            return None  # checked before anything else is done for this token
        if stored is not None and stored.connected and stored.node_id != self.node_id:
            stored = await self._await_release(stored)
            if stored is not None and not token_matches(stored, secret):
                return None  # the holder rotated the token before it let go (protocol 3)
        if stored is not None and (local is None or stored.epoch >= local.epoch):
            try:
                claimed = await self._op(self.store.claim_session(sid, self.node_id, stored.epoch))
            except STORE_ERRORS as e:
                self._failed(e, write=False)
                claimed = stored.to_record()
                claimed["epoch"] = str(stored.epoch + 1)
            if claimed is None:
                return None  # another connection claimed it a moment ago
            session = Session.from_record(claimed)
            if local is not None and local.epoch == stored.epoch:
                # Same holder as the store's record: this node's copy has the fresher
                # counters (the store has them as of the last flush).
                local.epoch = session.epoch
                session = local
            session.secret = secret  # the store holds its hash; hello gives the token back
            return session
        if local is None:
            return None
        # This node's copy is newer than the store's (not flushed yet, or Redis restarted
        # empty): our next write carries a higher epoch than any claim in the store.
        local.epoch += 1
        return local

    async def _await_release(self, stored: Session) -> Session | None:
        """A client that lost its socket often reconnects (through the balancer, to
        another node) before the old node has noticed the close and written the session's
        final record. Wait a moment for that record, so the latest settings and counters
        come along; after :data:`HANDOVER_WAIT_S` (the old node is dead, or its socket is
        half-open) resume from what the old node wrote at its last heartbeat."""
        deadline = time.monotonic() + min(HANDOVER_WAIT_S, self.cfg.heartbeat_s)
        seen = stored  # the newest record read: the holder may rotate the token meanwhile
        while time.monotonic() < deadline:
            await asyncio.sleep(_HANDOVER_POLL_S)
            try:
                rec = await self._op(self.store.get_session(stored.id))
            except STORE_ERRORS as e:
                self._failed(e, write=False)
                return seen
            if rec is None:
                return None  # ended meanwhile
            try:
                seen = Session.from_record(rec)
            except ValueError:
                return stored
            if not seen.connected or seen.epoch != stored.epoch:
                return seen
        return seen

    # -- admin views ------------------------------------------------------------------

    async def list_sessions(self) -> tuple[list[dict[str, Any]], bool]:
        """All sessions the store knows (across nodes); ``False`` when only local ones.

        A session counts as connected only while a live node lists it in its set, so a
        killed node's sessions show as disconnected once its key expired, and a record
        left behind by a late write does not pass for a connection."""
        try:
            records = await self._op(self.store.list_sessions())
            nodes = await self._op(self.store.list_nodes())
            held: set[tuple[str, str]] = set()
            for node in nodes:
                node_id = node.get("id", "")
                ids = await self._op(self.store.node_sessions(node_id))
                held.update((node_id, sid) for sid in ids)
        except STORE_ERRORS as e:
            self._failed(e, write=False)
            return [s.public() for s in self.live.values()], False
        held.update((self.node_id, sid) for sid in self.live)
        merged: dict[str, Session] = {}
        for r in records:
            try:
                s = Session.from_record(r)
            except ValueError:
                continue
            merged[s.id] = s
        for sid, s in self.live.items():  # this node's view of its own is the freshest
            if sid not in merged or s.epoch >= merged[sid].epoch:
                merged[sid] = s
        out = []
        for s in sorted(merged.values(), key=lambda s: (s.node_id, s.connected_at)):
            view = s.public()
            view["connected"] = s.connected and (s.node_id, s.id) in held
            out.append(view)
        return out, True

    async def list_nodes(self) -> tuple[list[dict[str, Any]], bool]:
        try:
            records = await self._op(self.store.list_nodes())
        except STORE_ERRORS as e:
            self._failed(e, write=False)
            return [node_public(self._node_record())], False
        return [node_public(r) for r in sorted(records, key=lambda r: r.get("id", ""))], True

    # -- flushing ---------------------------------------------------------------------

    async def _op(self, aw: Awaitable[T]) -> T:
        return await with_timeout(aw, self.cfg.op_timeout_s)

    def _failed(self, e: BaseException, *, write: bool = True) -> None:
        if not self.degraded:
            log.warning(
                "state store %s unreachable (%s); frames keep flowing",
                self.store.kind,
                str(e) or type(e).__name__,
            )
        self.degraded = True
        self._need_full = True
        self.last_error = str(e) or type(e).__name__
        if self._metrics is not None:
            if write:
                self._metrics.state_write_failures.inc()
            self._metrics.state_degraded.set(1)

    def _writes(self, full: bool) -> tuple[list[SessionWrite], list[tuple[str, _Final]]]:
        ttl = self.cfg.session_ttl_s
        if full:
            sessions = list(self.live.values())
        else:
            sessions = [self.live[sid] for sid in self._dirty if sid in self.live]
        writes = [SessionWrite(s.id, s.epoch, "live", ttl, s.to_record()) for s in sessions]
        finals = list(self._finals.items())
        now = time.monotonic()
        for sid, f in finals:
            if f.kind == "ended":
                writes.append(SessionWrite(sid, f.epoch, "ended"))
                continue
            # A release that waited out an outage keeps only what is left of its TTL:
            # the session must not become resumable for longer than promised.
            left = ttl - (now - f.closed_at)
            if left > 0:
                writes.append(SessionWrite(sid, f.epoch, "released", left, f.record))
        return writes, finals

    async def flush(self, full: bool = True) -> bool:
        """Write node, live sessions (all, or only new ones) and pending finals.

        Returns False when the store failed; the next flush is then a full one."""
        async with self._flush_lock:
            full = full or self._need_full
            writes, finals = self._writes(full)
            self._dirty.clear()
            try:
                await self._op(
                    self.store.write_node(self.node_id, self._node_record(), self.cfg.node_ttl_s)
                )
                refused = await self._op(
                    self.store.write_sessions(
                        self.node_id, writes, self.cfg.node_ttl_s, complete=full
                    )
                )
            except STORE_ERRORS as e:
                self._failed(e)
                return False
            for sid, f in finals:
                if self._finals.get(sid) is f:  # not replaced by a newer close meanwhile
                    del self._finals[sid]
            self._superseded(refused, {w.session_id: w.epoch for w in writes})
            if self.degraded:
                log.info("state store %s reachable again; state rewritten", self.store.kind)
            self.degraded = False
            self._need_full = self._need_full and not full
            self.last_error = None
            self.last_flush = time.time()
            if self._metrics is not None:
                self._metrics.state_degraded.set(0)
            return True

    def _superseded(self, refused: set[str], written_epoch: dict[str, int]) -> None:
        for sid in refused:
            s = self.live.get(sid)
            if s is None or s.epoch > written_epoch.get(sid, 0):
                continue  # closed here, or resumed here again since the write
            log.info("session %s was resumed on another node; dropping it here", sid)
            del self.live[sid]
            self._recent.pop(sid, None)
            if self._on_superseded is not None:
                self._on_superseded(sid)

    async def _loop(self) -> None:
        backoff = 0.0
        next_full = 0.0  # the first flush is a full one
        while True:
            if backoff:  # store down: retry on the backoff schedule, not on every change
                await asyncio.sleep(backoff)
            else:
                await wait_event(self._wake, max(0.0, next_full - time.monotonic()))
            self._wake.clear()
            full = time.monotonic() >= next_full
            if await self.flush(full=full):
                backoff = 0.0
                if full:
                    next_full = time.monotonic() + self.cfg.heartbeat_s
                await asyncio.sleep(_MIN_FLUSH_GAP_S)  # coalesce bursts of connects
            else:
                cap = min(self.cfg.heartbeat_s, _MAX_BACKOFF_S)
                backoff = min(cap, max(_FIRST_BACKOFF_S, backoff * 2))
