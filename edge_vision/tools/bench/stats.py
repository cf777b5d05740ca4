"""Latency statistics. Pure functions."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def percentiles(values: Sequence[float], ps: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    if not len(values):
        return {f"p{int(p)}": float("nan") for p in ps}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{int(p)}": float(np.percentile(arr, p)) for p in ps}


def summary(values: Sequence[float]) -> dict[str, float]:
    out = percentiles(values)
    arr = np.asarray(values, dtype=np.float64) if len(values) else np.zeros(0)
    out["mean"] = float(arr.mean()) if arr.size else float("nan")
    out["max"] = float(arr.max()) if arr.size else float("nan")
    out["n"] = float(arr.size)
    return out


def thirds_p99(times: Sequence[float], latencies: Sequence[float]) -> list[float]:
    """p99 latency in the first, middle and last third of the run (does it grow?)."""
    if not len(times):
        return [float("nan")] * 3
    t = np.asarray(times)
    lat = np.asarray(latencies)
    edges = np.linspace(t.min(), t.max() + 1e-9, 4)
    out = []
    for lo, hi in itertools.pairwise(edges):
        sel = lat[(t >= lo) & (t < hi)]
        out.append(float(np.percentile(sel, 99)) if sel.size else float("nan"))
    return out
