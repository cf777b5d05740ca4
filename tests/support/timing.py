"""Timeouts scaled by one environment factor, so slow boards pass without weakening tests."""

from __future__ import annotations

import os

FACTOR = float(os.environ.get("TEST_TIME_FACTOR", "1"))


def T(seconds: float) -> float:
    """``seconds`` scaled by ``TEST_TIME_FACTOR`` (default 1)."""
    return seconds * FACTOR
