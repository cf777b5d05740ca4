"""The session core: which frames of one session are served, when, and in what order.

One class, :class:`SessionCore`, owns every rule that joins the stages of the frame path
for one session, without I/O (no asyncio, no sockets), in the style of python-websockets'
``protocol.py``. Events go in as method calls; each returns the actions the caller must
carry out, in order. The server's connection (edge_vision.serve.connection) and replay's
in-process target (edge_vision.tools.replay) are thin shells that feed it and act, so both
serve frames by exactly the same rules (docs/protocol.md, "Admission").

The rules it owns:

* **Admission.** ``latest``: at most one frame waits; a newer one replaces it and the
  replaced frame is dropped. ``every``: up to ``every_queue`` frames wait in order; when
  full, :attr:`SessionCore.accepting` is False and the shell stops reading (TCP
  back-pressure) until there is room.
* **The in-flight limit.** A frame is *in flight* from the moment it is taken from
  admission (:class:`Process`) until its reply was sent, it was superseded, or the
  session closed: at most ``latest_in_flight`` / ``every_in_flight`` at once, per the
  mode in force.
* **Decode-ahead.** A frame taken in ``latest`` mode is prepared (decoded) alone: the
  next frame is taken only once it is :meth:`~SessionCore.prepared`, so the newest
  frame is the one decoded next and the engine always gets the freshest frame.
* **Superseding.** A ``latest`` frame that is prepared but still waiting for the engine
  is replaced by the session's next prepared frame, keeping its place in the engine's
  queue (edge_vision.frames.batch does the replacement, atomically, under
  :meth:`~SessionCore.supersede_key`); the shell reports it with
  :meth:`~SessionCore.superseded`, and it is dropped and its place given back at once.
  "Prepared" means "no longer needs the session's decode turn, now waiting for the
  engine": a canvas decoded on the host, or a frame still compressed whose header was
  checked and whose pixels a GPU batch will decode (edge_vision.frames.decode_gpu). The core
  never looks at the frame, so superseding works the same in both cases.
* **Reply order.** Replies are sent in the order frames were taken, one :class:`Send`
  per frame, each only once every frame ahead of it was sent or dropped. Arrival
  refusals (a frame failing its checks, no memory budget) are not frames of the core:
  the shell answers them at once and only :meth:`~SessionCore.refused` counts them.
* **The books.** ``received = answered + dropped + rejected + outstanding`` at every
  step (:attr:`~SessionCore.outstanding`, zero after :meth:`~SessionCore.close`):
  ``answered`` counts results sent, ``rejected`` error replies and refusals,
  ``dropped`` frames replaced, superseded, or closed on before their reply was sent.
  The counters live in a :class:`Books` (the :class:`~edge_vision.session.record.Session`
  itself in the server, so a resumed session carries on counting).

Actions out: :class:`Process` (start this frame's processing), :class:`Send` (its reply
is next in order), :class:`Drop` (frames dropped, already counted) and :class:`Release`
(nothing of this frame is needed any more: give its bytes back). Tested as a plain
object in tests/unit/test_session_core.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar

from ..common.settings import Mode

if TYPE_CHECKING:
    from ..config import SessionConfig

F = TypeVar("F")  # a frame, as the shell holds it (receive.FrameMessage in the server)
R = TypeVar("R")  # a reply, as the shell sends it (a result or a ClientError)

#: Where a taken frame is: being prepared (decoded, or its header read for a GPU batch),
#: waiting for or in the engine, its reply ready and waiting for its turn, being sent.
Stage = Literal["preparing", "prepared", "replied", "sending"]
DropReason = Literal["replaced", "superseded", "mode_changed", "closed"]


class Books(Protocol):
    """The session's counters (edge_vision.session.record.Session has them)."""

    received: int
    answered: int
    dropped: int
    rejected: int


class Tally:
    """Books of their own, for a core without a Session (tests, replay)."""

    __slots__ = ("answered", "dropped", "received", "rejected")

    def __init__(self) -> None:
        self.received = self.answered = self.dropped = self.rejected = 0

    def __repr__(self) -> str:
        return f"Tally({', '.join(f'{k}={getattr(self, k)}' for k in sorted(self.__slots__))})"


@dataclass(eq=False, slots=True)
class Ticket(Generic[F, R]):
    """One frame taken from admission, from :class:`Process` until its end."""

    seq: int  # taken order, from 0 per core: the reply order
    frame: F
    latest: bool  # taken in latest mode: decoded alone, may be superseded
    stage: Stage = "preparing"
    reply: R | None = None
    rejected: bool = False  # the reply is an error (already counted as rejected)


@dataclass(frozen=True, slots=True)
class Process(Generic[F, R]):
    """Start processing ``ticket.frame``; report :meth:`SessionCore.prepared`, then
    :meth:`~SessionCore.result_ready` or :meth:`~SessionCore.superseded`."""

    ticket: Ticket[F, R]


@dataclass(frozen=True, slots=True)
class Send(Generic[F, R]):
    """Send ``ticket.reply`` now (it is next in order); then :meth:`SessionCore.sent`."""

    ticket: Ticket[F, R]


@dataclass(frozen=True, slots=True)
class Drop(Generic[F]):
    """These frames will never be answered; already counted in ``dropped``."""

    frames: tuple[F, ...]
    reason: DropReason


@dataclass(frozen=True, slots=True)
class Release(Generic[F]):
    """Nothing of ``frame`` is needed any more (its processing is over or never began)."""

    frame: F


Action = Process[F, R] | Send[F, R] | Drop[F] | Release[F]


@dataclass(slots=True)
class _Limits:
    latest_in_flight: int
    every_in_flight: int
    every_queue: int


class SessionCore(Generic[F, R]):
    """Admission, in-flight limit, decode-ahead, superseding, reply order and books of
    one session (see the module docstring). Not thread-safe; the shell calls it from one
    thread (the event loop)."""

    def __init__(
        self,
        mode: Mode,
        *,
        latest_in_flight: int = 3,
        every_in_flight: int = 2,
        every_queue: int = 8,
        books: Books | None = None,
    ) -> None:
        if latest_in_flight < 1 or every_in_flight < 1 or every_queue < 1:
            raise ValueError("in-flight limits and every_queue must be >= 1")
        self._mode: Mode = mode
        self._limits = _Limits(latest_in_flight, every_in_flight, every_queue)
        self.books: Books = books if books is not None else Tally()
        self._waiting: deque[F] = deque()
        self._order: deque[Ticket[F, R]] = deque()  # taken, not finished, in taken order
        self._preparing_latest = 0  # latest frames still preparing: the decode turn
        self._next_seq = 0
        self._closed = False

    # -- state the shell reads ----------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        mode: Mode,
        session: SessionConfig,
        *,
        every_in_flight: int | None = None,
        books: Books | None = None,
    ) -> SessionCore[F, R]:
        """A core with the server's limits for a connection (``session.*``): the one
        wiring the server and in-process replay share; ``every_in_flight`` overrides
        ``session.every_in_flight`` (replay's ``--in-flight``)."""
        return cls(
            mode,
            latest_in_flight=session.latest_in_flight,
            every_in_flight=every_in_flight or session.every_in_flight,
            every_queue=session.every_queue,
            books=books,
        )

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def accepting(self) -> bool:
        """Whether :meth:`frame_arrived` may be called now. False only in ``every`` mode
        with a full queue: the shell reads nothing until an event makes room."""
        if self._closed:
            return False
        return self._mode == "latest" or len(self._waiting) < self._limits.every_queue

    @property
    def waiting(self) -> tuple[F, ...]:
        """Frames admitted and not taken yet, oldest first."""
        return tuple(self._waiting)

    @property
    def in_flight(self) -> int:
        """Frames taken whose reply is not sent yet (and not superseded)."""
        return len(self._order)

    @property
    def outstanding(self) -> int:
        """Frames received and not counted yet as answered, dropped or rejected: the
        books' "in flight" (waiting, or taken without an error reply counted)."""
        return len(self._waiting) + sum(1 for t in self._order if not t.rejected)

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._waiting and not self._order

    def supersede_key(self, ticket: Ticket[F, R]) -> Hashable | None:
        """The key under which the engine's queue may replace ``ticket``'s frame with
        this session's next one (edge_vision.frames.batch); None: it must not be replaced."""
        return self if ticket.latest else None

    # -- events in ----------------------------------------------------------------------

    def frame_arrived(self, frame: F) -> list[Action[F, R]]:
        """A frame passed its arrival checks: count it, admit it, maybe start it."""
        if self._closed:
            raise RuntimeError("frame_arrived() on a closed session core")
        if not self.accepting:
            raise RuntimeError("frame_arrived() while not accepting; wait for room first")
        self.books.received += 1
        actions: list[Action[F, R]] = []
        if self._mode == "latest" and self._waiting:
            replaced = list(self._waiting)
            self._waiting.clear()
            actions += self._drop(replaced, "replaced") + [Release(f) for f in replaced]
        self._waiting.append(frame)
        return actions + self._take()

    def abandoned(self, frame: F) -> list[Action[F, R]]:
        """A frame passed its arrival checks after its client was found gone (the shell
        can deliver no reply any more): received, and dropped at once."""
        self.books.received += 1
        return [*self._drop([frame], "closed"), Release(frame)]

    def refused(self) -> None:
        """A message that may have been a frame was refused on arrival (bad input, no
        memory budget, a close code): received and rejected. The shell answers it."""
        self.books.received += 1
        self.books.rejected += 1

    def prepared(self, ticket: Ticket[F, R]) -> list[Action[F, R]]:
        """``ticket``'s frame no longer needs the decode turn: decoded, or still
        compressed with its header checked, and now waiting for the engine."""
        if self._closed or ticket not in self._order or ticket.stage != "preparing":
            return []  # late (closed, superseded) or repeated: nothing changes
        self._end_turn(ticket)
        ticket.stage = "prepared"
        return self._take()

    def superseded(self, ticket: Ticket[F, R]) -> list[Action[F, R]]:
        """A newer frame of this session took ``ticket``'s place in the engine's queue:
        it is dropped, and its place goes to the next frame at once (held until the frame
        ahead of it was sent, it would keep the newest frame from being taken)."""
        if self._closed or ticket not in self._order:
            return []
        if not ticket.latest or ticket.stage != "prepared":
            raise RuntimeError(
                f"superseded() for frame {ticket.seq}, which may not be "
                f"({'every' if not ticket.latest else ticket.stage})"
            )
        self._order.remove(ticket)
        drop = self._drop([ticket.frame], "superseded")
        return [*drop, Release(ticket.frame), *self._take(), *self._sendable()]

    def result_ready(
        self, ticket: Ticket[F, R], reply: R, *, rejected: bool = False
    ) -> list[Action[F, R]]:
        """``ticket``'s reply is ready: a result, or (``rejected``) the error it earned,
        counted as rejected now. It is sent once every frame ahead of it was."""
        if self._closed or ticket not in self._order:
            return []
        if ticket.stage not in ("preparing", "prepared"):
            raise RuntimeError(f"result_ready() twice for frame {ticket.seq}")
        self._end_turn(ticket)  # an error while decoding ends the decode turn
        ticket.stage, ticket.reply, ticket.rejected = "replied", reply, rejected
        if rejected:
            self.books.rejected += 1
        return [Release(ticket.frame), *self._take(), *self._sendable()]

    def sent(self, ticket: Ticket[F, R]) -> list[Action[F, R]]:
        """``ticket``'s reply was delivered: a result is answered; its place is free."""
        if self._closed or ticket not in self._order:
            return []
        if ticket.stage != "sending":
            raise RuntimeError(f"sent() for frame {ticket.seq} that was not being sent")
        self._order.remove(ticket)
        if not ticket.rejected:
            self.books.answered += 1
        return self._take()

    def mode_changed(self, mode: Mode) -> list[Action[F, R]]:
        """Switch admission. Going to ``latest`` keeps only the newest waiting frame;
        frames already taken go on under the rules they were taken with."""
        if self._closed or mode == self._mode:
            self._mode = mode
            return []
        self._mode = mode
        actions: list[Action[F, R]] = []
        if mode == "latest" and len(self._waiting) > 1:
            old = [self._waiting.popleft() for _ in range(len(self._waiting) - 1)]
            actions += self._drop(old, "mode_changed") + [Release(f) for f in old]
        return actions + self._take()

    def close(self) -> list[Action[F, R]]:
        """The session's connection is gone: every frame waiting or in flight whose
        reply was not sent is dropped (an error reply not sent stays counted as
        rejected), and released. Later events are ignored."""
        if self._closed:
            return []
        self._closed = True
        unsent = [t for t in self._order if not t.rejected]
        lost = list(self._waiting) + [t.frame for t in unsent]
        releases: list[Action[F, R]] = [Release(f) for f in self._waiting]
        releases += [Release(t.frame) for t in self._order if t.stage in ("preparing", "prepared")]
        self._waiting.clear()
        self._order.clear()
        self._preparing_latest = 0
        return self._drop(lost, "closed") + releases

    # -- the rules ----------------------------------------------------------------------

    def _limit(self) -> int:
        lim = self._limits
        return lim.latest_in_flight if self._mode == "latest" else lim.every_in_flight

    def _take(self) -> list[Action[F, R]]:
        """Start every waiting frame the rules allow now."""
        actions: list[Action[F, R]] = []
        while (
            self._waiting
            and not self._closed
            and self._preparing_latest == 0  # one latest frame prepares at a time
            and len(self._order) < self._limit()
        ):
            latest = self._mode == "latest"
            ticket: Ticket[F, R] = Ticket(self._next_seq, self._waiting.popleft(), latest)
            self._next_seq += 1
            self._order.append(ticket)
            if latest:
                self._preparing_latest += 1
            actions.append(Process(ticket))
        return actions

    def _sendable(self) -> list[Action[F, R]]:
        """A :class:`Send` for each reply ready at the head of the order."""
        actions: list[Action[F, R]] = []
        for ticket in self._order:
            if ticket.stage == "sending":
                continue
            if ticket.stage != "replied":
                break
            ticket.stage = "sending"
            actions.append(Send(ticket))
        return actions

    def _end_turn(self, ticket: Ticket[F, R]) -> None:
        """``ticket`` no longer holds the latest decode turn (prepared, or ended early)."""
        if ticket.stage == "preparing" and ticket.latest:
            self._preparing_latest -= 1

    def _drop(self, frames: Sequence[F], reason: DropReason) -> list[Action[F, R]]:
        if not frames:
            return []
        self.books.dropped += len(frames)
        return [Drop(tuple(frames), reason)]


__all__ = [
    "Action",
    "Books",
    "Drop",
    "DropReason",
    "Mode",
    "Process",
    "Release",
    "Send",
    "SessionCore",
    "Stage",
    "Tally",
    "Ticket",
]
