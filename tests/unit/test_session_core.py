"""The session core as a plain object: no event loop, no server, literal events.

Every admission rule (latest, every, the in-flight limit, decode-ahead), superseding at
each stage a frame can be in, reply order, the books and close.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from edge_vision.session.core import (
    Action,
    Drop,
    Process,
    Release,
    Send,
    SessionCore,
    Ticket,
)
from edge_vision.session.record import Session

Core = SessionCore[str, str]
T = Ticket[str, str]


def processed(actions: Sequence[Action[str, str]]) -> list[T]:
    return [a.ticket for a in actions if isinstance(a, Process)]


def sent(actions: Sequence[Action[str, str]]) -> list[str]:
    return [a.ticket.frame for a in actions if isinstance(a, Send)]


def dropped(actions: Sequence[Action[str, str]]) -> list[str]:
    return [f for a in actions if isinstance(a, Drop) for f in a.frames]


def released(actions: Sequence[Action[str, str]]) -> list[str]:
    return [a.frame for a in actions if isinstance(a, Release)]


def books(core: Core) -> tuple[int, int, int, int]:
    b = core.books
    return b.received, b.answered, b.dropped, b.rejected


def assert_books_balance(core: Core) -> None:
    b = core.books
    assert b.received == b.answered + b.dropped + b.rejected + core.outstanding


def answer(core: Core, ticket: T) -> list[Action[str, str]]:
    """The frame's result is ready and, once its Send comes, delivered."""
    actions = core.result_ready(ticket, f"result {ticket.frame}")
    out = list(actions)
    for a in actions:
        if isinstance(a, Send):
            out += core.sent(a.ticket)
    return out


# -- latest: admission, decode-ahead, the in-flight limit ---------------------------------


def test_latest_first_frame_starts_at_once_and_a_newer_waiting_frame_replaces_the_older() -> None:
    core: Core = SessionCore("latest", latest_in_flight=3)
    [first] = processed(core.frame_arrived("f0"))
    assert first.frame == "f0" and first.latest and first.seq == 0
    # f0 is decoding: one latest frame decodes at a time, so f1 waits ...
    assert core.frame_arrived("f1") == []
    assert core.waiting == ("f1",)
    # ... and f2 takes its place: f1 is dropped, counted, and its bytes may go.
    actions = core.frame_arrived("f2")
    assert dropped(actions) == ["f1"] and released(actions) == ["f1"]
    assert [a.reason for a in actions if isinstance(a, Drop)] == ["replaced"]
    assert core.waiting == ("f2",)
    assert books(core) == (3, 0, 1, 0)
    assert_books_balance(core)


def test_latest_decode_ahead_takes_the_next_frame_once_the_previous_is_prepared() -> None:
    core: Core = SessionCore("latest", latest_in_flight=3)
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    [t1] = processed(core.prepared(t0))  # f0 waits for the engine; f1 decodes meanwhile
    assert t1.frame == "f1"
    assert core.prepared(t0) == []  # repeated: nothing changes
    assert core.in_flight == 2 and core.waiting == ()


def test_latest_in_flight_limit_holds_frames_until_a_reply_is_sent() -> None:
    core: Core = SessionCore("latest", latest_in_flight=2)
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    [t1] = processed(core.prepared(t0))
    core.frame_arrived("f2")
    assert core.prepared(t1) == []  # two in flight: f2 waits though nothing decodes
    assert core.waiting == ("f2",)
    actions = core.result_ready(t0, "r0")
    assert released(actions) == ["f0"]  # processing over: its bytes may go now ...
    [send] = [a for a in actions if isinstance(a, Send)]
    assert processed(actions) == []  # ... but its place is held until the reply is sent
    assert [t.frame for t in processed(core.sent(send.ticket))] == ["f2"]
    assert books(core) == (3, 1, 0, 0)


def test_latest_an_error_while_decoding_ends_the_decode_turn() -> None:
    core: Core = SessionCore("latest")
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    actions = core.result_ready(t0, "bad_image", rejected=True)
    assert [t.frame for t in processed(actions)] == ["f1"]
    assert sent(actions) == ["f0"]
    core.sent(t0)
    assert books(core) == (2, 0, 0, 1)  # an error reply is rejected, never answered
    assert_books_balance(core)


def test_the_last_frame_a_client_sends_is_always_answered() -> None:
    core: Core = SessionCore("latest", latest_in_flight=3)
    [t0] = processed(core.frame_arrived("f0"))
    for i in range(1, 10):
        core.frame_arrived(f"f{i}")  # a burst while f0 decodes: only the newest waits
    [t9] = processed(core.prepared(t0))
    assert t9.frame == "f9"
    answer(core, t0)
    core.prepared(t9)
    answer(core, t9)
    assert books(core) == (10, 2, 8, 0) and core.idle


# -- superseding, at each stage -----------------------------------------------------------


def test_superseded_while_waiting_for_the_engine_gives_its_place_back_at_once() -> None:
    core: Core = SessionCore("latest", latest_in_flight=3)
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    [t1] = processed(core.prepared(t0))  # f0 inferring
    core.frame_arrived("f2")
    [t2] = processed(core.prepared(t1))  # f1 waits for the engine
    core.frame_arrived("f3")
    assert core.prepared(t2) == []  # three in flight: f3 waits
    assert core.supersede_key(t2) is core.supersede_key(t1) is not None
    # f2 took f1's place in the engine's queue (batch.py did it): f1 is dropped, its
    # bytes released, and its place goes to f3 now, not when f0's reply is sent.
    actions = core.superseded(t1)
    assert dropped(actions) == ["f1"] and released(actions) == ["f1"]
    assert [a.reason for a in actions if isinstance(a, Drop)] == ["superseded"]
    assert [t.frame for t in processed(actions)] == ["f3"]
    # Replies keep order without the superseded frame: f0, then f2.
    assert sent(core.result_ready(t2, "r2")) == []
    assert sent(core.result_ready(t0, "r0")) == ["f0", "f2"]
    assert books(core) == (4, 0, 1, 0)
    assert_books_balance(core)


def test_superseded_after_its_frame_was_prepared_still_compressed() -> None:
    # A frame bound for a GPU batch decode is "prepared" once its header was checked on
    # the host, its bytes still compressed: superseding is the same for the core.
    core: Core = SessionCore("latest", latest_in_flight=3)
    compressed = "jpeg bytes of f0 (header checked, not decoded)"
    [t0] = processed(core.frame_arrived(compressed))
    core.prepared(t0)
    [t1] = processed(core.frame_arrived("f1"))
    core.prepared(t1)
    actions = core.superseded(t0)
    assert dropped(actions) == [compressed] and released(actions) == [compressed]
    assert sent(answer(core, t1)) == ["f1"]
    assert books(core) == (2, 1, 1, 0)


def test_a_frame_still_decoding_or_in_every_mode_cannot_be_superseded() -> None:
    core: Core = SessionCore("latest")
    [t0] = processed(core.frame_arrived("f0"))
    with pytest.raises(RuntimeError, match="preparing"):
        core.superseded(t0)  # the shell reports prepared before the engine sees it
    every: Core = SessionCore("every")
    [e0] = processed(every.frame_arrived("e0"))
    assert every.supersede_key(e0) is None  # the engine queue never replaces it
    every.prepared(e0)
    with pytest.raises(RuntimeError, match="every"):
        every.superseded(e0)


def test_a_frame_whose_reply_is_ready_is_no_longer_superseded() -> None:
    core: Core = SessionCore("latest")
    [t0] = processed(core.frame_arrived("f0"))
    core.prepared(t0)
    core.result_ready(t0, "r0")
    with pytest.raises(RuntimeError):
        core.superseded(t0)


# -- every: order, the queue, back-pressure -----------------------------------------------


def test_every_serves_every_frame_in_order_with_its_in_flight_limit() -> None:
    core: Core = SessionCore("every", every_in_flight=2, every_queue=8)
    started = [t for i in range(5) for t in processed(core.frame_arrived(f"f{i}"))]
    assert [t.frame for t in started] == ["f0", "f1"]  # every frames decode side by side
    assert core.waiting == ("f2", "f3", "f4")
    t0, t1 = started
    assert not t0.latest and core.supersede_key(t0) is None
    # f1 finishes first; its reply waits for f0's.
    assert core.result_ready(t1, "r1") == [Release("f1")]
    actions = core.result_ready(t0, "r0")
    assert sent(actions) == ["f0", "f1"]
    assert processed(core.sent(t0)) != [] and core.in_flight == 2
    assert books(core) == (5, 1, 0, 0)
    assert_books_balance(core)


def test_every_full_queue_stops_accepting_and_nothing_is_dropped() -> None:
    core: Core = SessionCore("every", every_in_flight=1, every_queue=2)
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    core.frame_arrived("f2")
    assert not core.accepting  # the shell stops reading: TCP back-pressure
    with pytest.raises(RuntimeError, match="not accepting"):
        core.frame_arrived("f3")
    actions = answer(core, t0)
    assert [t.frame for t in processed(actions)] == ["f1"] and core.accepting
    assert dropped(actions) == [] and core.books.dropped == 0


def test_a_frame_read_after_its_client_was_found_gone_is_received_and_dropped() -> None:
    core: Core = SessionCore("every", every_in_flight=1, every_queue=1)
    core.frame_arrived("f0")
    core.frame_arrived("f1")
    assert not core.accepting
    actions = core.abandoned("f2")  # the reader had it in hand, waiting for room
    assert dropped(actions) == ["f2"] and released(actions) == ["f2"]
    assert_books_balance(core)
    closing = core.close()
    assert sorted(dropped(closing)) == ["f0", "f1"]
    assert books(core) == (3, 0, 3, 0)


def test_every_errors_keep_their_place_in_reply_order() -> None:
    core: Core = SessionCore("every", every_in_flight=3)
    t0, t1, t2 = [t for i in range(3) for t in processed(core.frame_arrived(f"f{i}"))]
    assert sent(core.result_ready(t2, "r2")) == []
    assert sent(core.result_ready(t1, "bad_image", rejected=True)) == []
    actions = core.result_ready(t0, "r0")
    assert sent(actions) == ["f0", "f1", "f2"]
    for t in (t0, t1, t2):
        core.sent(t)
    assert books(core) == (3, 2, 0, 1) and core.idle


# -- mode changes -------------------------------------------------------------------------


def test_switching_to_latest_keeps_only_the_newest_waiting_frame() -> None:
    core: Core = SessionCore("every", every_in_flight=1)
    [t0] = processed(core.frame_arrived("f0"))
    for i in range(1, 5):
        core.frame_arrived(f"f{i}")
    actions = core.mode_changed("latest")
    assert dropped(actions) == ["f1", "f2", "f3"]
    assert [a.reason for a in actions if isinstance(a, Drop)] == ["mode_changed"]
    # The latest limit (3) applies now and nothing latest decodes: f4 starts at once.
    [t4] = processed(actions)
    assert t4.frame == "f4" and t4.latest and not t0.latest
    assert books(core) == (5, 0, 3, 0)
    assert_books_balance(core)


def test_switching_to_every_lifts_the_decode_turn_only_once_the_latest_frame_is_prepared() -> None:
    core: Core = SessionCore("latest")
    [t0] = processed(core.frame_arrived("f0"))
    core.frame_arrived("f1")
    assert core.mode_changed("every") == []  # f0, taken as latest, still decodes alone
    assert core.mode_changed("every") == []
    [t1] = processed(core.prepared(t0))
    assert not t1.latest
    core.frame_arrived("f2")
    core.frame_arrived("f3")
    assert core.waiting == ("f2", "f3")  # every keeps both; the limit (2) holds f2


# -- reply order, the books, close -------------------------------------------------------


def test_books_are_the_session_so_a_resumed_session_counts_on() -> None:
    s = Session("0123456789abcdef", "s" * 24, "node", "latest", 0.5)
    s.received, s.answered, s.dropped, s.rejected = 10, 7, 2, 1
    core: SessionCore[str, str] = SessionCore("latest", books=s)
    core.refused()  # a frame refused on arrival (bad input, memory budget)
    [t0] = processed(core.frame_arrived("f0"))
    core.prepared(t0)
    answer(core, t0)
    assert s.counters() == {"received": 12, "answered": 8, "dropped": 2, "rejected": 2}


def test_close_drops_everything_waiting_or_unsent_and_releases_each_frame_once() -> None:
    core: Core = SessionCore("every", every_in_flight=3)
    t0, t1, t2 = [t for i in range(4) for t in processed(core.frame_arrived(f"f{i}"))]
    core.result_ready(t0, "r0")  # being sent when the socket goes
    core.result_ready(t1, "bad_image", rejected=True)  # an error not sent yet
    releases = ["f0", "f1"]
    actions = core.close()
    # f0 (sending), f2 (processing) and f3 (waiting) are dropped; f1 stays rejected.
    assert dropped(actions) == ["f3", "f0", "f2"]
    assert [a.reason for a in actions if isinstance(a, Drop)] == ["closed"]
    releases += released(actions)
    assert sorted(releases) == ["f0", "f1", "f2", "f3"]
    assert books(core) == (4, 0, 3, 1) and core.in_flight == 0 and core.idle
    assert_books_balance(core)
    # Events arriving after close (tasks finishing late) change nothing.
    assert core.result_ready(t2, "r2") == [] and core.sent(t0) == []
    assert core.prepared(t2) == [] and core.mode_changed("latest") == []
    assert core.close() == [] and not core.accepting
    with pytest.raises(RuntimeError, match="closed"):
        core.frame_arrived("f4")
    assert books(core) == (4, 0, 3, 1)


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError):
        SessionCore("latest", latest_in_flight=0)
    core: Core = SessionCore("every")
    [t0] = processed(core.frame_arrived("f0"))
    with pytest.raises(RuntimeError, match="not being sent"):
        core.sent(t0)
    core.result_ready(t0, "r0")
    with pytest.raises(RuntimeError, match="twice"):
        core.result_ready(t0, "r0")


# -- every rule at once, on random event orders -------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_event_orders_keep_every_rule(seed: int) -> None:
    """A random shell: frames, settings, results, errors, supersedes and sends in any
    order the rules allow. After every step the books balance, the limits hold and at
    most one latest frame decodes; replies go out in taken order; at close every frame
    was released exactly once and nothing is left in flight."""
    rng = random.Random(seed)
    limits = {"latest": rng.randint(2, 4), "every": rng.randint(1, 3)}
    core: Core = SessionCore(
        rng.choice(["latest", "every"]),
        latest_in_flight=limits["latest"],
        every_in_flight=limits["every"],
        every_queue=rng.randint(1, 4),
    )
    live: list[T] = []  # taken, reply not ready
    to_send: list[T] = []  # Send actions not carried out yet, in order
    sent_seqs: list[int] = []
    releases: list[str] = []
    n = 0

    def act(actions: Sequence[Action[str, str]]) -> None:
        live.extend(processed(actions))
        to_send.extend(a.ticket for a in actions if isinstance(a, Send))
        releases.extend(released(actions))

    for _ in range(300):
        choice = rng.random()
        if choice < 0.35 and core.accepting:
            act(core.frame_arrived(f"f{n}"))
            n += 1
        elif choice < 0.4:
            act(core.mode_changed(rng.choice(["latest", "every"])))
        elif choice < 0.45:
            core.refused()
        elif choice < 0.8 and live:
            t = rng.choice(live)
            if t.stage == "preparing" and rng.random() < 0.7:
                act(core.prepared(t))
            elif t.stage == "prepared" and t.latest and rng.random() < 0.3:
                live.remove(t)
                act(core.superseded(t))
            else:
                live.remove(t)
                act(core.result_ready(t, "r", rejected=rng.random() < 0.2))
        elif to_send:
            t = to_send.pop(0)
            sent_seqs.append(t.seq)
            act(core.sent(t))
        assert_books_balance(core)
        assert core.in_flight <= max(limits.values())
        assert sum(1 for t in live if t.latest and t.stage == "preparing") <= 1
        assert sent_seqs == sorted(sent_seqs)
    act(core.close())
    assert core.in_flight == 0 and not core.waiting
    b = core.books
    assert b.received == b.answered + b.dropped + b.rejected
    assert sorted(releases) == sorted(f"f{i}" for i in range(n))
