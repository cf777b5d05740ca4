"""Admission policy: latest-wins drops and counts, every keeps order and bounds."""

from __future__ import annotations

import asyncio

import pytest

from edge_vision.admit import Admission, AdmissionCore


def test_latest_keeps_only_newest_and_returns_dropped() -> None:
    core: AdmissionCore[int] = AdmissionCore("latest", capacity=8)
    assert core.offer(1) == []
    assert core.offer(2) == [1]
    assert core.offer(3) == [2]
    assert core.take() == 3
    assert core.take() is None


def test_every_keeps_order_up_to_capacity() -> None:
    core: AdmissionCore[int] = AdmissionCore("every", capacity=3)
    for i in range(3):
        assert core.offer(i) == []
    assert core.full
    with pytest.raises(RuntimeError):
        core.offer(3)
    assert [core.take(), core.take(), core.take()] == [0, 1, 2]


def test_switch_to_latest_drops_all_but_newest() -> None:
    core: AdmissionCore[int] = AdmissionCore("every", capacity=5)
    for i in range(4):
        core.offer(i)
    assert core.set_mode("latest") == [0, 1, 2]
    assert core.take() == 3


async def test_every_mode_put_waits_for_room() -> None:
    adm: Admission[int] = Admission("every", capacity=1)
    await adm.put(1)
    blocked = asyncio.create_task(adm.put(2))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # back-pressure: the reader waits, nothing is dropped
    assert await adm.get() == 1
    assert await blocked == []
    assert await adm.get() == 2


async def test_latest_mode_put_never_waits() -> None:
    adm: Admission[int] = Admission("latest", capacity=1)
    assert await adm.put(1) == []
    assert await adm.put(2) == [1]
    assert await adm.get() == 2
