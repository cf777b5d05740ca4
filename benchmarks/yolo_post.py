"""What a YOLO v8/v11 frame costs the host to post-process, by what the engine hands it.

A GPU engine NMS's a YOLO v8/v11 output on the device (``engine.torch.device_post``,
:func:`~edge_vision.model.heads.yolo_v8_device_nms`), so the host reads kept boxes instead of
scoring and NMS-ing anchors itself, on a worker thread that holds the worker's GIL while
it does. This times :class:`~edge_vision.model.heads.YoloV8Head` on one frame's outputs in
each form an engine may return them:

* ``raw``: the whole ``[84, 8400]`` output (ONNX Runtime, or ``device_post: false``);
* ``top``: its best 1,024 anchors in the same layout (what the torch engine returned
  before the NMS moved to the device);
* ``device``: the device NMS's 1,024 candidates and their kept/suppressed bytes.

Outputs are synthetic (:func:`yolo_v8_output`: no YOLO weights exist on this machine) with
``N`` objects a frame (5, 40, 150 by default), each a cluster of overlapping anchors; the
device form is made by the same torch function on the CPU, so this needs torch. Run::

    python -m benchmarks.yolo_post [--objects 5 40 150] [--frames 20] [--rounds 5]
        [--confidence 0.25] [--json out.json]

Prints, for each form, the median and p90 milliseconds a frame (wall and thread CPU),
the bytes that come back from the device a frame, and whether the detections equal the
raw output's (they may not when more than 1,024 anchors reach the confidence
threshold, as with 150 objects of ~7 anchors each).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_vision.model import device_post
from edge_vision.model import heads as post
from edge_vision.model.shape import Letterbox

from .versions import timing_row

F32Array = npt.NDArray[np.float32]
LETTERBOX = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
CANDIDATES = 1024


def yolo_v8_output(rng: np.random.Generator, objects: int, batch: int = 2) -> F32Array:
    """A YOLO v8 raw output ``[B, 84, 8400]`` shaped as a trained model's looks: every
    anchor a faint guess (class scores under 0.05), and round each object a cluster of
    anchors whose boxes overlap it, scoring 0.3-0.95 in its class. Synthetic: no YOLO
    weights exist on this machine (none ship, and nothing is downloaded at run time)."""
    nc, anchors = 80, 8400
    out = np.zeros((batch, 4 + nc, anchors), np.float32)
    out[:, :2] = rng.uniform(0, 640, (batch, 2, anchors))
    out[:, 2:4] = rng.uniform(4, 60, (batch, 2, anchors))
    out[:, 4:] = rng.uniform(0, 0.05, (batch, nc, anchors))
    for b in range(batch):
        for _ in range(objects):
            cx, cy, w, h = rng.uniform(40, 600), rng.uniform(40, 600), *rng.uniform(20, 120, 2)
            cls = rng.integers(nc)
            for a in rng.choice(anchors, rng.integers(3, 12), replace=False):
                out[b, :4, a] = cx + rng.normal(0, 3), cy + rng.normal(0, 3), w, h
                out[b, 4 + cls, a] = rng.uniform(0.3, 0.95)
    return out


def forms(raw: F32Array, iou: float) -> dict[str, list[list[np.ndarray]]]:
    """Each frame of ``raw`` ``[B, 84, A]`` as each form an engine returns: the outputs
    of frame ``b`` are ``forms[name][b]``."""
    import torch

    best = np.argsort(-raw[:, 4:].max(axis=1), axis=1, kind="stable")[:, :CANDIDATES]
    dets, state = device_post.yolo_v8_device_nms(torch, torch.from_numpy(raw), CANDIDATES, iou)
    return {
        "raw": [[r] for r in raw],
        "top": [[np.ascontiguousarray(r[:, i])] for r, i in zip(raw, best, strict=True)],
        "device": [[d, s] for d, s in zip(dets.numpy(), state.numpy(), strict=True)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, nargs="+", default=[5, 40, 150])
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--confidence", type=float, default=0.25)
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    head = post.YoloV8Head()
    results: dict[str, Any] = {"confidence": args.confidence, "objects": {}}
    for n in args.objects:
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        nbytes: dict[str, int] = {}
        same = {"top": True, "device": True}
        undecided = found = 0
        for r in range(args.rounds):
            raw = yolo_v8_output(np.random.default_rng(1000 * n + r), n, batch=args.frames)
            by_form = forms(raw, head.nms_iou)
            undecided += sum(
                bool((o[1] == device_post.NMS_UNDECIDED).any()) for o in by_form["device"]
            )
            want: list[np.ndarray] = []
            for name, frames in by_form.items():
                nbytes[name] = sum(o.nbytes for o in frames[0])
                for i, outputs in enumerate(frames):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    dets = head.decode(outputs, LETTERBOX, args.confidence)
                    wall.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
                    cpu.setdefault(name, []).append((time.thread_time() - c0) * 1e3)
                    if name == "raw":
                        want.append(dets)
                        found += len(dets)
                    else:
                        same[name] &= dets.shape == want[i].shape and np.allclose(
                            dets, want[i], atol=1e-4
                        )
        row: dict[str, Any] = {
            name: {**timing_row(wall[name], cpu[name], "frames"), "bytes_back": nbytes[name]}
            for name in wall
        }
        row["same_detections"] = same
        row["detections_per_frame"] = found / (args.rounds * args.frames)
        row["device_undecided_frames"] = undecided
        results["objects"][str(n)] = row
        print(f"{n:4d} objects ({row['detections_per_frame']:.1f} found a frame)")
        for name in wall:
            f = row[name]
            print(
                f"  {name:6s} {f['bytes_back']:8,d} bytes back  wall median {f['median_ms']:.3f}"
                f" / p90 {f['p90_ms']:.3f} ms, CPU median {f['cpu_median_ms']:.3f} ms"
                + (f"  same detections: {same[name]}" if name in same else "")
            )
        print(f"  device rounds left {undecided} frame(s) to the host's NMS")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
