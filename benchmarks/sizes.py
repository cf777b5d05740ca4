"""Input-size sweep on the CPU: agreement with the reference pipeline and frames/s per size.

For each fit (``model.fit``: letterbox, stretch) and long side (640, 960, 1280 by default)
and real photos from the scikit-image wheel scaled to a camera frame (1280×720 by
default), it runs the default model through our shape stage and DB head and through
PP-OCR's reference pipeline (rapidocr's
``ch_ppocr_det`` pre- and post-processing, its ``Det`` settings, ``limit_type: max`` at
the same long side), pools the matching of the two box sets (edge_vision.common.agreement), and
times our per-frame path (letterbox + normalise, ONNX Runtime, post) on one stream.
docs/results.md holds its figures. Run::

    python -m benchmarks.sizes [--sizes 640 960 1280] [--threads 2] [--repeats 5]
        [--fits letterbox stretch]

Needs ``rapidocr`` (the default model's wheel) and ``scikit-image`` (the photos; in the
``test`` extra).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_vision.common.agreement import Agreement, match_detections
from edge_vision.config import ModelConfig
from edge_vision.model.heads import DbnetHead
from edge_vision.model.shape import Fit
from edge_vision.model.spec import ModelSpec, load_model_spec
from tests.support.reference import (
    TEXT_PHOTOS,
    our_detections,
    our_input,
    photo_frame,
    reference_detections,
)

U8Array = npt.NDArray[np.uint8]
F32Array = npt.NDArray[np.float32]


# Photos with text in them: a printed page, handwriting, labels on boxes in a garage
# (two views), an astronaut's name tag and mission patch, a rocket's lettering.
def agreement_at(session: Any, spec: ModelSpec, frames: list[U8Array], long_side: int) -> Agreement:
    """Our boxes against the reference's on ``frames``, pooled."""
    pooled = Agreement(0, 0, 0, 0.5, 1.0)
    for img in frames:
        ref = reference_detections(session, img, long_side)
        pooled += match_detections(ref, our_detections(session, spec, img, long_side))
    return pooled


def time_frame(session: Any, spec: ModelSpec, img: U8Array, long_side: int) -> tuple[float, ...]:
    """Seconds for our shape stage, the model and our DB head on one frame."""
    head = DbnetHead()
    t0 = time.perf_counter()
    x, lb = our_input(spec, img, long_side)
    t1 = time.perf_counter()
    pred = session.run(None, {spec.input_name: x})[0]
    t2 = time.perf_counter()
    head.decode([pred[0]], lb, 0.5)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def sweep(
    sizes: list[int],
    *,
    frame: tuple[int, int] = (1280, 720),
    photos: tuple[str, ...] = TEXT_PHOTOS,
    threads: int = 2,
    repeats: int = 5,
    fits: tuple[Fit, ...] = ("letterbox",),
) -> list[dict[str, Any]]:
    """One row per fit and size: agreement with the reference, per-stage ms and frames/s.

    The timing rounds interleave the sizes and fits (one frame at each in turn), so load
    from other processes on a shared machine falls on all alike; each figure is the
    median over ``repeats`` rounds of all photos, after one untimed warm-up round."""
    import onnxruntime as ort

    base = load_model_spec(ModelConfig())
    specs = {fit: replace(base, limits=replace(base.limits, fit=fit)) for fit in fits}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(base.path), opts, providers=["CPUExecutionProvider"])
    frames = [photo_frame(p, *frame) for p in photos]
    cases = [(fit, size) for fit in fits for size in sizes]
    times: dict[tuple[Fit, int], list[tuple[float, ...]]] = {case: [] for case in cases}
    for r in range(repeats + 1):
        for img in frames:
            for fit, size in cases:
                t = time_frame(session, specs[fit], img, size)
                if r:
                    times[fit, size].append(t)
    rows = []
    for fit, size in cases:
        spec = specs[fit]
        med = [float(np.median([t[i] for t in times[fit, size]])) * 1000.0 for i in range(3)]
        total = float(np.median([sum(t) for t in times[fit, size]])) * 1000.0
        _, lb = our_input(spec, frames[0], size)
        rows.append(
            {
                "fit": fit,
                "long_side": size,
                "input": f"{lb.out_w}x{lb.out_h}",
                **agreement_at(session, spec, frames, size).as_dict(),
                "prep_ms": round(med[0], 2),
                "infer_ms": round(med[1], 2),
                "post_ms": round(med[2], 2),
                "frames_per_s": round(1000.0 / total, 2),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fit | long side | input | ref boxes | ours | matched | recall | precision | "
        "infer ms | post ms | frames/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fit']} | {r['long_side']} | {r['input']} | {r['reference']} | "
            f"{r['candidate']} | "
            f"{r['matched']} | {r['recall']:.3f} | {r['precision']:.3f} | {r['infer_ms']} | "
            f"{r['post_ms']} | {r['frames_per_s']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[640, 960, 1280])
    ap.add_argument("--frame", type=int, nargs=2, default=[1280, 720], metavar=("W", "H"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--fits", nargs="+", choices=["letterbox", "stretch"], default=["letterbox", "stretch"]
    )
    ap.add_argument("--json", action="store_true", help="print JSON rows, not a table")
    args = ap.parse_args(argv)
    rows = sweep(
        args.sizes,
        frame=(args.frame[0], args.frame[1]),
        threads=args.threads,
        repeats=args.repeats,
        fits=tuple(args.fits),
    )
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
