"""The GPU process's queue, with literal frames: a latest frame replaced there is never
decoded, every-mode frames keep their order, the session served least recently goes first
across workers, and a cancelled or orphaned frame leaves the queue."""

from __future__ import annotations

from edge_vision.gpu_process.pending import PendingQueue

A, B, C = ("w0", 1), ("w1", 1), ("w0", 2)  # (worker, session) owners


def drain(q: PendingQueue[str]) -> list[str]:
    out = []
    while (nxt := q.pop()) is not None:
        out.append(nxt[1])
    return out


def test_a_newer_latest_frame_takes_the_waiting_ones_place_and_the_old_is_returned() -> None:
    q: PendingQueue[str] = PendingQueue()
    assert q.add(A, "a1", latest=True) is None
    assert q.add(B, "b1", latest=True) is None
    assert q.add(A, "a2", latest=True) == "a1"  # answered superseded: never decoded
    assert q.add(A, "a3", latest=True) == "a2"
    assert len(q) == 2
    assert drain(q) == ["a3", "b1"]  # a3 kept a1's place, ahead of b1


def test_every_mode_frames_are_never_replaced_and_keep_their_order() -> None:
    q: PendingQueue[str] = PendingQueue()
    for f in ("a1", "a2", "a3"):
        assert q.add(A, f, latest=False) is None
    assert drain(q) == ["a1", "a2", "a3"]


def test_the_session_served_least_recently_goes_first_across_workers() -> None:
    q: PendingQueue[str] = PendingQueue()
    # A floods in every mode on worker 0; B (worker 1) and C (worker 0) send one each.
    for i in range(4):
        q.add(A, f"a{i}", latest=False)
    q.add(B, "b0", latest=False)
    first = q.pop()
    assert first == (A, "a0")
    q.add(C, "c0", latest=False)
    # B and C were never served: both go before A's second frame.
    assert drain(q) == ["b0", "c0", "a1", "a2", "a3"]


def test_a_session_that_comes_back_after_a_quiet_spell_is_not_put_last() -> None:
    q: PendingQueue[str] = PendingQueue()
    q.add(B, "b0", latest=True)
    assert q.pop() == (B, "b0")
    for i in range(3):
        q.add(A, f"a{i}", latest=False)
    q.pop()  # a0: A is now served more recently than B
    q.add(B, "b1", latest=True)
    assert q.pop() == (B, "b1")


def test_a_cancelled_frame_leaves_the_queue_and_others_stay() -> None:
    q: PendingQueue[str] = PendingQueue()
    q.add(A, "a1", latest=False)
    q.add(A, "a2", latest=False)
    assert q.remove(A, "a1") is True
    assert q.remove(A, "a1") is False
    assert q.remove(B, "b9") is False
    assert drain(q) == ["a2"]
    q.add(C, "c1", latest=True)
    assert q.remove(C, "c1") is True and len(q) == 0 and q.pop() is None


def test_a_gone_workers_frames_are_taken_out_before_any_decode() -> None:
    q: PendingQueue[str] = PendingQueue()
    q.add(A, "a1", latest=True)
    q.add(C, "c1", latest=False)
    q.add(C, "c2", latest=False)
    q.add(B, "b1", latest=True)
    gone = q.purge(lambda owner: isinstance(owner, tuple) and owner[0] == "w0")
    assert sorted(gone) == ["a1", "c1", "c2"]
    assert len(q) == 1 and drain(q) == ["b1"]
