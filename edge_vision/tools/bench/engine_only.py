"""The engine alone, called directly in a loop: the ceiling the service is held against.

Same model, same input shape as the load test, batch sizes 1..max; each batch size is
timed with one batch in flight and with ``engine.in_flight`` batches in flight (the
pipelined ceiling GPU engines reach with several streams).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from ...config import Config
from ...engines import Engine, create_engine
from ...engines.choice import resolve_engine
from ...model.shape import choose_input_shape
from ...model.spec import ModelSpec
from .stats import percentiles


async def measure_engine(
    spec: ModelSpec,
    config: Config,
    width: int,
    height: int,
    seconds: float = 3.0,
    batch_sizes: list[int] | None = None,
    log: Any = print,
    start_at: float | None = None,
) -> dict[str, Any]:
    """The engine's rows; ``start_at`` (wall-clock epoch seconds): wait after loading and
    graph capture until then, so that engines in several processes (the workers of a GPU
    host, with or without MPS) are timed at the same time."""
    config = resolve_engine(config)
    engine = create_engine(config.engine.kind, spec, config)
    await engine.start()
    h, w = choose_input_shape(width, height, spec.limits)
    try:
        await engine.prepare([(h, w)])
        if start_at is not None:
            wait = start_at - time.time()
            if wait < 0:
                log(f"engine-only: ready {-wait:.1f} s after --engine-start-at; timing now")
            await asyncio.sleep(max(0.0, wait))
        timed_from = time.time()
        rng = np.random.default_rng(0)
        sizes = batch_sizes or list(range(1, engine.max_batch + 1))
        rows = []
        for b in sizes:
            frames = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for _ in range(b)]
            for _ in range(3):  # warm-up: first runs of a shape pay allocation/tuning
                await engine.infer(frames)
            row: dict[str, Any] = {"batch": b, "input": f"{w}x{h}"}
            for label, depth in (("serial", 1), ("pipelined", engine.max_in_flight)):
                if label == "pipelined" and depth == 1:
                    row["pipelined"] = row["serial"]
                    continue
                lat, done, elapsed = await _timed(engine, frames, depth, seconds)
                row[label] = {
                    "in_flight": depth,
                    "batches": done,
                    "frames_per_s": done * b / elapsed,
                    "batch_ms": percentiles(lat),
                }
            rows.append(row)
            log(
                f"engine-only {engine.kind} batch {b:>2} at {w}x{h}: "
                f"{row['serial']['frames_per_s']:.1f} frames/s serial "
                f"(p50 {row['serial']['batch_ms']['p50']:.1f} ms/batch), "
                f"{row['pipelined']['frames_per_s']:.1f} frames/s with "
                f"{row['pipelined']['in_flight']} in flight"
            )
        return {
            "engine": engine.describe(),
            "input": [h, w],
            "rows": rows,
            "timed_from": timed_from,
            "timed_until": time.time(),
        }
    finally:
        await engine.close()


async def _timed(
    engine: Engine, frames: list[np.ndarray], depth: int, seconds: float
) -> tuple[list[float], int, float]:
    """Call the engine from ``depth`` concurrent loops for ``seconds``: per-call latencies
    (ms), batches done, elapsed seconds."""
    lat: list[float] = []
    t0 = time.perf_counter()
    t_end = t0 + seconds

    async def loop() -> None:
        while time.perf_counter() < t_end:
            s = time.perf_counter()
            await engine.infer(frames)
            lat.append((time.perf_counter() - s) * 1000.0)

    await asyncio.gather(*(loop() for _ in range(depth)))
    return lat, len(lat), time.perf_counter() - t0
