"""The node's connection balancer's decision (edge_vision.serve.balance.hand_order): no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from edge_vision.serve.balance import hand_order


def pick_worker(
    clients: Sequence[int], handed: Sequence[int], received: Sequence[int], warm: Sequence[bool]
) -> int:
    """The worker that gets the next connection: the first of the hand-over order."""
    return hand_order(clients, handed, received, warm)[0]


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


def test_a_warm_worker_takes_connections_up_to_a_fair_share_while_others_warm_up() -> None:
    """After a restart the first warm worker must not take every reconnecting camera
    (WebSockets never move afterwards): up to a fair share it takes them, past that they
    go to a worker still warming up, which asks the camera to come back later."""
    assert pick_worker([0, 0], [0, 0], [0, 0], [True, False]) == 0
    assert pick_worker([3, 0], [3, 0], [3, 0], [True, False]) == 1
    handed = [0] * 12
    warm = [True] + [False] * 11
    for _ in range(64):
        handed[pick_worker([0] * 12, handed, [0] * 12, warm)] += 1
    assert max(handed) <= 6 and handed[0] >= 1, handed
    # None warm yet (the node is starting): every worker may take one (a health probe).
    assert pick_worker([2, 0], [0, 0], [0, 0], [False, False]) == 1


def test_ties_go_to_the_lowest_worker() -> None:
    assert pick_worker([1, 1, 1], [0, 0, 0], [0, 0, 0], [True] * 3) == 0


def test_the_hand_over_order_falls_back_by_load() -> None:
    """When the first choice cannot take the socket (gone, full queue), the next by load
    does: every worker appears once, the rest in order of their estimated clients."""
    assert hand_order([3, 1, 2], [0, 0, 0], [0, 0, 0], [True] * 3) == [1, 2, 0]
    # The handed-but-not-yet-counted sockets move a worker back in the order.
    assert hand_order([0, 0, 0], [2, 0, 1], [0, 0, 0], [True] * 3) == [1, 2, 0]
