"""The node's connection balancer's decision (edge_vision.balance.pick_worker): no I/O."""

from __future__ import annotations

from edge_vision.balance import pick_worker


def test_the_worker_with_the_fewest_clients_gets_the_connection() -> None:
    assert pick_worker([3, 1, 2], [0, 0, 0], [0, 0, 0], [True] * 3) == 1


def test_connections_handed_since_a_worker_s_last_beat_count_as_its_clients() -> None:
    """Eight cameras connecting within one beat go 4 and 4, not all to the emptiest."""
    handed, got = [0, 0], []
    for _ in range(8):
        w = pick_worker([0, 0], handed, [0, 0], [True, True])
        handed[w] += 1
        got.append(w)
    assert got.count(0) == got.count(1) == 4
    # Its beat says it took in what it was handed: then only the clients it has count.
    assert pick_worker([1, 4], [4, 4], [4, 4], [True, True]) == 0


def test_a_worker_still_warming_up_gets_none_while_another_is_warm() -> None:
    assert pick_worker([9, 0], [9, 0], [9, 0], [True, False]) == 0
    # None warm yet (the node is starting): every worker may take one (a health probe).
    assert pick_worker([2, 0], [0, 0], [0, 0], [False, False]) == 1


def test_ties_go_to_the_lowest_worker() -> None:
    assert pick_worker([1, 1, 1], [0, 0, 0], [0, 0, 0], [True] * 3) == 0
