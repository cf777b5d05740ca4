"""The state store contract (edge_vision/state/base.py), run against every implementation.

The in-process MemoryStore and the RedisStore (over TCP, a unix socket, and TLS with a
password) must agree on records, TTL expiry, the node's session set, and the epoch rule
that lets the newest holder of a session win. Redis variants run a real redis-server.
Key names and TTLs seen directly in Redis are checked against docs/state.md at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from edge_vision.config import StateConfig
from edge_vision.errors import StateUnavailable
from edge_vision.state import create_store
from edge_vision.state.base import SessionWrite, StateStore
from edge_vision.state.memory import MemoryStore
from edge_vision.state.redis import RedisStore

from ..support.redis_server import RedisServer, raw_client
from ..support.timing import T

NODE_A, NODE_B = "node-a", "node-b"
SHORT = 0.4  # a TTL short enough to watch expire
LONG = 60.0


def session_record(sid: str, epoch: int, node: str = NODE_A, **extra: str) -> dict[str, str]:
    return {"id": sid, "secret": "s3cret", "node": node, "epoch": str(epoch), **extra}


def live(sid: str, epoch: int = 1, node: str = NODE_A, ttl: float = LONG) -> SessionWrite:
    return SessionWrite(sid, epoch, "live", ttl, session_record(sid, epoch, node))


def released(sid: str, epoch: int = 1, node: str = NODE_A, ttl: float = LONG) -> SessionWrite:
    rec = session_record(sid, epoch, node, connected="0")
    return SessionWrite(sid, epoch, "released", ttl, rec)


async def expired(t: float = SHORT) -> None:
    await asyncio.sleep(t + T(0.3))


STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-unix", marks=pytest.mark.redis),
    pytest.param("redis-tls", marks=pytest.mark.redis),
]


@pytest.fixture(params=STORES)
async def store(
    request: pytest.FixtureRequest, redis_factory: Callable[..., RedisServer]
) -> AsyncIterator[StateStore]:
    kind = request.param
    if kind == "memory":
        st: StateStore = create_store(StateConfig())
        assert isinstance(st, MemoryStore)
    else:
        options: dict[str, Any] = {}
        if kind == "redis-unix":
            options["unix_socket"] = True
        if kind == "redis-tls":
            options.update(tls=True, password="contract-test-password")
        srv = await asyncio.to_thread(redis_factory, **options)
        cfg = StateConfig(
            redis_url=srv.url,
            redis_password=srv.password,
            redis_tls_ca=srv.cert,
        )
        st = create_store(cfg)
        assert isinstance(st, RedisStore)
    await st.start()
    await st.ping()
    try:
        yield st
    finally:
        await st.close()


# -- nodes -----------------------------------------------------------------------------


async def test_node_record_is_listed_and_expires_unless_refreshed(store: StateStore) -> None:
    await store.write_node(NODE_A, {"id": NODE_A, "model": "m"}, SHORT)
    await store.write_node(NODE_B, {"id": NODE_B, "model": "m"}, LONG)
    assert sorted(n["id"] for n in await store.list_nodes()) == [NODE_A, NODE_B]
    await expired()
    assert [n["id"] for n in await store.list_nodes()] == [NODE_B]


async def test_heartbeat_keeps_a_node_alive_past_its_ttl(store: StateStore) -> None:
    for _ in range(4):
        await store.write_node(NODE_A, {"id": NODE_A}, SHORT)
        await asyncio.sleep(SHORT / 2)
    assert [n["id"] for n in await store.list_nodes()] == [NODE_A]


async def test_node_record_is_replaced_not_merged(store: StateStore) -> None:
    await store.write_node(NODE_A, {"id": NODE_A, "old_field": "x"}, LONG)
    await store.write_node(NODE_A, {"id": NODE_A, "load": "3"}, LONG)
    assert await store.list_nodes() == [{"id": NODE_A, "load": "3"}]


async def test_remove_node_drops_node_and_its_set_but_sessions_stay_resumable(
    store: StateStore,
) -> None:
    await store.write_node(NODE_A, {"id": NODE_A}, LONG)
    await store.write_sessions(NODE_A, [live("a1")], LONG)
    await store.remove_node(NODE_A)
    assert await store.list_nodes() == []
    assert await store.node_sessions(NODE_A) == set()
    assert await store.get_session("a1") is not None


# -- sessions --------------------------------------------------------------------------


async def test_live_session_is_readable_listed_and_in_the_node_set(store: StateStore) -> None:
    refused = await store.write_sessions(NODE_A, [live("a1"), live("a2")], LONG)
    assert refused == set()
    assert await store.get_session("a1") == session_record("a1", 1)
    assert sorted(r["id"] for r in await store.list_sessions()) == ["a1", "a2"]
    assert await store.node_sessions(NODE_A) == {"a1", "a2"}
    assert await store.node_sessions(NODE_B) == set()


async def test_session_expires_after_its_ttl_unless_rewritten(store: StateStore) -> None:
    await store.write_sessions(NODE_A, [live("a1", ttl=SHORT), live("a2", ttl=SHORT)], LONG)
    for _ in range(3):
        await asyncio.sleep(SHORT / 2)
        await store.write_sessions(NODE_A, [live("a2", ttl=SHORT)], LONG)
    assert await store.get_session("a1") is None
    assert await store.get_session("a2") is not None
    assert [r["id"] for r in await store.list_sessions()] == ["a2"]


async def test_node_set_expires_with_the_node_when_heartbeats_stop(store: StateStore) -> None:
    """SIGKILL: nobody refreshes; the set goes with the node TTL, sessions with theirs."""
    await store.write_node(NODE_A, {"id": NODE_A}, SHORT)
    await store.write_sessions(NODE_A, [live("a1", ttl=LONG)], SHORT)
    assert await store.node_sessions(NODE_A) == {"a1"}
    await expired()
    assert await store.list_nodes() == []
    assert await store.node_sessions(NODE_A) == set()
    assert await store.get_session("a1") is not None  # still resumable elsewhere


async def test_released_session_leaves_the_node_set_and_expires(store: StateStore) -> None:
    await store.write_sessions(NODE_A, [live("a1")], LONG)
    await store.write_sessions(NODE_A, [released("a1", ttl=SHORT)], LONG)
    assert await store.node_sessions(NODE_A) == set()
    rec = await store.get_session("a1")
    assert rec is not None and rec["connected"] == "0"
    await expired()
    assert await store.get_session("a1") is None


async def test_ended_session_is_deleted(store: StateStore) -> None:
    await store.write_sessions(NODE_A, [live("a1"), live("a2")], LONG)
    await store.write_sessions(NODE_A, [SessionWrite("a1", 1, "ended")], LONG)
    assert await store.get_session("a1") is None
    assert await store.node_sessions(NODE_A) == {"a2"}
    assert [r["id"] for r in await store.list_sessions()] == ["a2"]


async def test_session_record_is_replaced_not_merged(store: StateStore) -> None:
    rec = session_record("a1", 1, classes="[0, 2]")
    await store.write_sessions(NODE_A, [SessionWrite("a1", 1, "live", LONG, rec)], LONG)
    await store.write_sessions(NODE_A, [live("a1")], LONG)
    assert await store.get_session("a1") == session_record("a1", 1)


async def test_a_complete_write_rebuilds_the_node_set(store: StateStore) -> None:
    """A heartbeat lists every session the node holds; ids a lost write left behind go."""
    await store.write_sessions(NODE_A, [live("a1"), live("a2"), live("a3")], LONG)
    refused = await store.write_sessions(NODE_A, [live("a2"), live("a4")], LONG, complete=True)
    assert refused == set()
    assert await store.node_sessions(NODE_A) == {"a2", "a4"}
    assert await store.get_session("a1") is not None  # records are left to their TTL


# -- who wins: epochs and claims -------------------------------------------------------


async def test_claim_moves_the_session_to_the_new_node_once(store: StateStore) -> None:
    await store.write_sessions(NODE_A, [live("a1", epoch=3)], LONG)
    assert await store.claim_session("a1", NODE_B, expected_epoch=2) is None
    claimed = await store.claim_session("a1", NODE_B, expected_epoch=3)
    assert claimed is not None
    assert (claimed["epoch"], claimed["node"], claimed["connected"]) == ("4", NODE_B, "1")
    assert claimed["secret"] == "s3cret"
    assert await store.node_sessions(NODE_A) == set()
    assert await store.claim_session("a1", NODE_A, expected_epoch=3) is None
    assert await store.claim_session("missing", NODE_B, expected_epoch=1) is None


async def test_two_nodes_claiming_at_once_cannot_both_win(store: StateStore) -> None:
    await store.write_sessions(NODE_A, [released("a1", epoch=1)], LONG)
    results = await asyncio.gather(
        *(store.claim_session("a1", f"node-{i}", expected_epoch=1) for i in range(5))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    rec = await store.get_session("a1")
    assert rec is not None and rec["node"] == winners[0]["node"] and rec["epoch"] == "2"


async def test_the_old_holder_cannot_overwrite_a_newer_holder(store: StateStore) -> None:
    """Node A's socket was half-open while the client resumed on B: A's heartbeat and
    A's late final writes are refused and reported, B's record stays."""
    await store.write_sessions(NODE_A, [live("a1", epoch=1)], LONG)
    assert await store.claim_session("a1", NODE_B, expected_epoch=1) is not None
    assert await store.write_sessions(NODE_B, [live("a1", epoch=2, node=NODE_B)], LONG) == set()
    assert await store.write_sessions(NODE_A, [live("a1", epoch=1)], LONG) == {"a1"}
    assert await store.write_sessions(NODE_A, [released("a1", epoch=1)], LONG) == {"a1"}
    ended = SessionWrite("a1", 1, "ended")
    assert await store.write_sessions(NODE_A, [ended, live("a9")], LONG) == {"a1"}
    rec = await store.get_session("a1")
    assert rec is not None and (rec["node"], rec["epoch"]) == (NODE_B, "2")
    assert await store.node_sessions(NODE_A) == {"a9"}
    assert await store.node_sessions(NODE_B) == {"a1"}


async def test_a_write_after_expiry_recreates_the_session(store: StateStore) -> None:
    """After a Redis restart (empty) the holder's next heartbeat brings its sessions back."""
    await store.write_sessions(NODE_A, [live("a1", epoch=5, ttl=SHORT)], LONG)
    await expired()
    assert await store.write_sessions(NODE_A, [live("a1", epoch=5)], LONG) == set()
    assert await store.get_session("a1") == session_record("a1", 5)


# -- Redis only: what the documented keys look like, and failures ---------------------


@pytest.mark.redis
async def test_redis_keys_and_ttls_are_the_documented_ones(redis_server: RedisServer) -> None:
    """docs/state.md: ev:node:<id> (hash), ev:node:<id>:sessions (set), ev:session:<id>
    (hash), with the node TTL on the first two and the session TTL on the third."""
    st = RedisStore(redis_server.url)
    async with raw_client(redis_server.url) as raw:
        try:
            await st.write_node(NODE_A, {"id": NODE_A}, 15)
            await st.write_sessions(NODE_A, [live("a1", ttl=120)], 15)
            assert sorted(await raw.keys("*")) == [
                "ev:node:node-a",
                "ev:node:node-a:sessions",
                "ev:session:a1",
            ]
            assert await raw.type("ev:node:node-a") == "hash"
            assert await raw.type("ev:node:node-a:sessions") == "set"
            assert await raw.type("ev:session:a1") == "hash"
            assert 14_000 < await raw.pttl("ev:node:node-a") <= 15_000
            assert 14_000 < await raw.pttl("ev:node:node-a:sessions") <= 15_000
            assert 119_000 < await raw.pttl("ev:session:a1") <= 120_000
            assert await raw.hget("ev:session:a1", "epoch") == "1"
        finally:
            await st.close()


@pytest.mark.redis
async def test_key_prefix_separates_two_services_on_one_redis(redis_server: RedisServer) -> None:
    prod = create_store(StateConfig(redis_url=redis_server.url))
    staging = create_store(StateConfig(redis_url=redis_server.url, key_prefix="staging:ev:"))
    try:
        await prod.write_node(NODE_A, {"id": NODE_A}, LONG)
        await staging.write_node(NODE_B, {"id": NODE_B}, LONG)
        await staging.write_sessions(NODE_B, [live("b1", node=NODE_B)], LONG)
        assert [n["id"] for n in await prod.list_nodes()] == [NODE_A]
        assert [n["id"] for n in await staging.list_nodes()] == [NODE_B]
        assert await prod.list_sessions() == []
    finally:
        await prod.close()
        await staging.close()


@pytest.mark.redis
async def test_redis_down_is_state_unavailable_and_recovery_needs_no_restart(
    redis_server: RedisServer,
) -> None:
    st = RedisStore(redis_server.url, op_timeout_s=0.5)
    try:
        await st.write_node(NODE_A, {"id": NODE_A}, LONG)
        await asyncio.to_thread(redis_server.kill)
        with pytest.raises(StateUnavailable):
            await st.write_node(NODE_A, {"id": NODE_A}, LONG)
        with pytest.raises(StateUnavailable):
            await st.get_session("a1")
        await asyncio.to_thread(redis_server.start)  # same port, empty
        assert await st.list_nodes() == []
        await st.write_node(NODE_A, {"id": NODE_A}, LONG)
        assert [n["id"] for n in await st.list_nodes()] == [NODE_A]
    finally:
        await st.close()


@pytest.mark.redis
async def test_wrong_redis_password_is_state_unavailable(
    redis_factory: Callable[..., RedisServer],
) -> None:
    srv = await asyncio.to_thread(redis_factory, password="right")
    st = create_store(StateConfig(redis_url=srv.url, redis_password="wrong"))
    try:
        with pytest.raises(StateUnavailable):
            await st.ping()
    finally:
        await st.close()
