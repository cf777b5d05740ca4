"""engine.cuda_sync blocking (edge_vision/engines/cuda/base.py): the device's primary context is
told to put waiting threads to sleep, through cuda-python's driver API. A mock driver
stands in for cuda-python, which needs a GPU; without it the reason comes back."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from edge_vision.engines.cuda import use_blocking_sync
from edge_vision.engines.cuda.base import CU_CTX_SCHED_BLOCKING_SYNC


def _mock_driver(monkeypatch: pytest.MonkeyPatch, set_flags_error: int = 0) -> list[Any]:
    calls: list[Any] = []
    driver = types.ModuleType("cuda.bindings.driver")

    def init(flags: int) -> tuple[int]:
        calls.append(("cuInit", flags))
        return (0,)

    def device_get(i: int) -> tuple[int, str]:
        calls.append(("cuDeviceGet", i))
        return (0, f"dev{i}")

    driver.cuInit = init  # type: ignore[attr-defined]
    driver.cuDeviceGet = device_get  # type: ignore[attr-defined]

    def set_flags(dev: Any, flags: int) -> tuple[int]:
        calls.append(("cuDevicePrimaryCtxSetFlags", dev, flags))
        return (set_flags_error,)

    driver.cuDevicePrimaryCtxSetFlags = set_flags  # type: ignore[attr-defined]
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver  # type: ignore[attr-defined]
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings  # type: ignore[attr-defined]
    for name, module in (
        ("cuda", cuda),
        ("cuda.bindings", bindings),
        ("cuda.bindings.driver", driver),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_mock_blocking_sync_sets_the_primary_context_s_scheduling_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _mock_driver(monkeypatch)
    assert use_blocking_sync(1) is None
    assert calls == [
        ("cuInit", 0),
        ("cuDeviceGet", 1),
        ("cuDevicePrimaryCtxSetFlags", "dev1", CU_CTX_SCHED_BLOCKING_SYNC),
    ]
    assert CU_CTX_SCHED_BLOCKING_SYNC == 4  # cuda.h's CU_CTX_SCHED_BLOCKING_SYNC


def test_mock_blocking_sync_says_why_when_cuda_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    _mock_driver(monkeypatch, set_flags_error=201)
    problem = use_blocking_sync(0)
    assert problem is not None and "cuDevicePrimaryCtxSetFlags failed (201)" in problem
