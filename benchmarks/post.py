"""What DB post-processing costs a frame (edge_vision.model.heads), and against an older version.

Every frame of the default text detector goes through :class:`~edge_vision.model.heads.DbnetHead`
on a worker thread, holding the worker's GIL for its Python parts; on the GPU path it was
the largest holder of it (docs/benchmarks.md). Probability maps of ``N`` rotated text lines
(2, 20, 100 by default) are drawn at the engine's 640×352 input for a 1280×720 frame and
blurred as the model's answer is; each map is decoded from the float map (ONNX Runtime,
the CPU path) and from its byte map (a GPU engine's ``engine.torch.device_post``, made
by the same torch function on the CPU, so the byte maps need torch). With
``--baseline REV`` the ``edge_vision/model/heads.py`` of that git revision runs the same maps,
one version after the other on each round's maps, and its detections and their rotated
rectangles are compared with the current ones. Run::

    python -m benchmarks.post [--boxes 2 20 100] [--maps 40] [--rounds 5]
        [--baseline REV] [--opencv-threads N] [--gap-ms MS] [--json out.json]

Prints the median and p90 milliseconds per frame, wall clock and the process's CPU time:
OpenCV's own pool threads included (``--opencv-threads``, cv2.setNumThreads; OpenCV's
default is one per core). ``--gap-ms`` idles between maps, as frames reach a post thread
apart in the service, where a pool that waits actively for more work burns that time.
"""

from __future__ import annotations

import argparse
import json
import time
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from edge_vision.model import device_post
from edge_vision.model import heads as post
from edge_vision.model.shape import plan_letterbox

from .versions import add_version_arguments, timing_cells, timing_row, versions_to_run

F32Array = npt.NDArray[np.float32]
LETTERBOX = plan_letterbox(1280, 720, 352, 640)


def prob_map(n: int, seed: int) -> F32Array:
    """A ``[1, 1, 352, 640]`` DB map: ``n`` lines of 0.6-0.95 turned up to 45°, blurred,
    inside the letterboxed frame."""
    rng = np.random.default_rng(seed)
    lb = LETTERBOX
    m = np.zeros((lb.out_h, lb.out_w), np.float32)
    for _ in range(n):
        cx = rng.uniform(lb.pad_x + 40, lb.pad_x + lb.new_w - 40)
        cy = rng.uniform(lb.pad_y + 20, lb.pad_y + lb.new_h - 20)
        rect = ((cx, cy), (rng.uniform(20, 80), rng.uniform(6, 14)), rng.uniform(-45, 45))
        cv2.fillPoly(m, [cv2.boxPoints(rect).astype(np.int32)], float(rng.uniform(0.6, 0.95)))
    return np.asarray(cv2.GaussianBlur(m, (5, 5), 1.2), np.float32)[None, None]


def byte_map(prob: F32Array, threshold: float) -> npt.NDArray[np.uint8]:
    """The byte map a GPU engine returns, made by the same :func:`device_post.db_map_bytes`
    (torch on the CPU)."""
    import torch

    return np.asarray(device_post.db_map_bytes(torch, torch.from_numpy(prob), threshold).numpy())


def time_maps(
    module: ModuleType, maps: list[np.ndarray], confidence: float, gap_s: float = 0.0
) -> tuple[list[float], list[float], list[list[Any]]]:
    """Wall and process-CPU milliseconds per decode over ``maps`` (the CPU from one map's
    start to the next's, ``gap_s`` of idling included, so a thread pool spinning after the
    call counts), and the detections with their rotated rectangles (what the read stage
    straightens)."""
    head = module.DbnetHead()
    wall, cpu, dets = [], [], []
    for m in maps:
        t0, c0 = time.perf_counter(), time.process_time()
        boxes, quads = head.decode_quads([m], LETTERBOX, confidence)
        wall.append((time.perf_counter() - t0) * 1e3)
        if gap_s:
            time.sleep(gap_s)
        cpu.append((time.process_time() - c0) * 1e3)
        dets.append([boxes.tolist(), quads.tolist()])
    return wall, cpu, dets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--boxes", type=int, nargs="+", default=[2, 20, 100])
    p.add_argument("--maps", type=int, default=40)
    p.add_argument("--confidence", type=float, default=0.5)
    p.add_argument("--opencv-threads", type=int, default=None, help="cv2.setNumThreads")
    p.add_argument("--gap-ms", type=float, default=0.0, help="idle between maps")
    add_version_arguments(p, "model.heads")
    args = p.parse_args(argv)
    if args.opencv_threads is not None:
        cv2.setNumThreads(args.opencv_threads)
    versions = versions_to_run(post, "model.heads", args.baseline)
    threshold = post.DbnetHead.bin_threshold
    results: dict[str, Any] = {
        "versions": list(versions),
        "opencv_threads": cv2.getNumThreads(),
        "gap_ms": args.gap_ms,
        "maps": {},
    }
    print(f"OpenCV threads {cv2.getNumThreads()}, {args.gap_ms:g} ms between maps")
    for kind in ("float", "bytes"):
        for n in args.boxes:
            wall: dict[str, list[float]] = {v: [] for v in versions}
            cpu: dict[str, list[float]] = {v: [] for v in versions}
            same, found = True, 0
            for r in range(args.rounds):
                maps: list[np.ndarray] = [
                    prob_map(n, seed=10_000 * n + 100 * r + i) for i in range(args.maps)
                ]
                if kind == "bytes":
                    maps = [byte_map(m, threshold) for m in maps]
                dets = {}
                for v, module in versions.items():
                    w, c, dets[v] = time_maps(module, maps, args.confidence, args.gap_ms / 1e3)
                    wall[v] += w
                    cpu[v] += c
                same &= all(d == dets["current"] for d in dets.values())
                found += sum(len(boxes) for boxes, _ in dets["current"])
            row: dict[str, Any] = {v: timing_row(wall[v], cpu[v], "frames") for v in versions}
            row["same_detections"] = same
            row["detections_per_frame"] = found / (args.rounds * args.maps)
            results["maps"][f"{kind}-{n}"] = row
            cells = timing_cells(row, versions)
            tail = "" if len(versions) == 1 else f"  same detections: {same}"
            print(
                f"{kind:5s} {n:4d} lines ({row['detections_per_frame']:.1f} found)  {cells}{tail}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
