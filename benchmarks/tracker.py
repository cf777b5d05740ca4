"""What one tracker update costs (edge_vision.frames.track), and against an older version of it.

The update runs on the event loop (connection.py, in reply order), so its time is time
every connection of the worker waits. Clips of ``N`` text boxes (1, 20, 300 by default:
a label, a shelf, a printed page of words) scroll across a 1280×720 frame with jitter, a
few boxes missed per frame; each clip is fed frame by frame to a fresh tracker and every
``update`` is timed. With ``--baseline REV`` the ``edge_vision/frames/track.py`` of that git
revision is loaded beside the current one and both run the same clips, interleaved clip by
clip so a loaded machine's noise falls on both alike; their ids are compared too. Run::

    python -m benchmarks.tracker [--boxes 1 20 300] [--frames 60] [--rounds 5]
        [--baseline REV] [--json out.json]

Prints the median and p90 milliseconds per update, wall clock and the thread's CPU time (on
a shared machine the wall clock's tail is mostly the scheduler handing the core to someone
else); docs/results.md holds the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_vision.frames import track

from .versions import add_version_arguments, timing_cells, timing_row, versions_to_run

F64Array = npt.NDArray[np.float64]


def clip(n: int, frames: int, seed: int) -> list[F64Array]:
    """``frames`` frames of ``n`` word boxes in lines, moving 6 px right and 4 px down per
    frame with ±1.5 px jitter; from the third frame on, 2 % of the boxes are missed."""
    rng = np.random.default_rng(seed)
    boxes: list[list[float]] = []
    per_line = max(1, min(n, 10))
    for k in range(n):
        r, c = divmod(k, per_line)
        w = float(rng.uniform(30, 100))
        x, y = 20 + 120 * c, 20 + 34 * r
        boxes.append([x, y, x + w, y + 24, float(rng.uniform(0.3, 1.0)), 0.0])
    base = np.array(boxes, np.float64)
    out = []
    for i in range(frames):
        f = base.copy()
        f[:, [0, 2]] += 6 * i
        f[:, [1, 3]] += 4 * i
        f[:, :4] += rng.normal(0, 1.5, (n, 4))
        seen = (rng.random(n) > 0.02) | (i < 3)
        out.append(f[seen])
    return out


def time_clip(
    module: ModuleType, frames: list[F64Array], fps: float
) -> tuple[list[float], list[float], list[list[int]]]:
    """Wall and thread-CPU milliseconds per ``update`` over ``frames``, and the ids."""
    tracker = module.Tracker()
    wall, cpu, ids = [], [], []
    for i, f in enumerate(frames):
        t0, c0 = time.perf_counter(), time.thread_time()
        got = tracker.update(f, i / fps)
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
        ids.append(got.tolist())
    return wall, cpu, ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--boxes", type=int, nargs="+", default=[1, 20, 300])
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--fps", type=float, default=15.0)
    add_version_arguments(p, "frames.track")
    args = p.parse_args(argv)
    versions = versions_to_run(track, "frames.track", args.baseline)
    results: dict[str, Any] = {"versions": list(versions), "boxes": {}}
    for n in args.boxes:
        wall: dict[str, list[float]] = {v: [] for v in versions}
        cpu: dict[str, list[float]] = {v: [] for v in versions}
        same_ids = True
        for r in range(args.rounds):
            frames = clip(n, args.frames, seed=1000 * n + r)
            ids = {}
            for v, module in versions.items():
                w, c, ids[v] = time_clip(module, frames, args.fps)
                wall[v] += w[1:]  # the first update only starts tracks
                cpu[v] += c[1:]
            same_ids &= all(i == ids["current"] for i in ids.values())
        row: dict[str, Any] = {v: timing_row(wall[v], cpu[v], "updates") for v in versions}
        row["same_ids"] = same_ids
        results["boxes"][str(n)] = row
        cells = timing_cells(row, versions)
        print(f"{n:4d} boxes  {cells}" + ("" if len(versions) == 1 else f"  same ids: {same_ids}"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
