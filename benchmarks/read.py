"""The recogniser's cost on this machine: per box and per batch, and with ``--compare`` the
torch path's agreement with ONNX Runtime on the CPU (docs/reading.md)::

    python -m benchmarks.read --boxes 16 --repeats 5 --threads 2
    python -m benchmarks.read --engine torch --device cuda:0 --compare --boxes 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from edge_vision.engines.recognisers import (
    OnnxRuntimeRecogniser,
    TorchRecogniser,
    load_recogniser,
)
from edge_vision.frames.read import TextReader, recogniser_batches
from edge_vision.model.spec import default_recogniser_path

U8Array = npt.NDArray[np.uint8]


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Per-box and per-batch cost of the recogniser on this machine, and (with
    ``--compare``) the torch path's agreement with ONNX Runtime on the CPU."""
    rng = np.random.default_rng(0)
    path = Path(args.model) if args.model else None
    rec = load_recogniser(
        path, args.engine, threads=args.threads, device=args.device, fp16=not args.fp32
    )
    reader = TextReader(rec, args.batch)
    reader.warm_up()
    crops = _sample_crops(rng, args.boxes)
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        read = reader.read_crops(crops)
    per_frame = (time.perf_counter() - t0) / args.repeats
    out: dict[str, Any] = {
        "recogniser": rec.describe(),
        "boxes": args.boxes,
        "batch": args.batch,
        "ms_per_frame": round(per_frame * 1000, 2),
        "ms_per_box": round(per_frame * 1000 / max(args.boxes, 1), 2),
        "texts": [r.text for r in read],
    }
    if args.compare:
        ref = OnnxRuntimeRecogniser(path or default_recogniser_path(), args.threads)
        x = recogniser_batches(crops, args.batch)[0][1]
        import torch

        if not isinstance(rec, TorchRecogniser):
            raise SystemExit("--compare needs --engine torch")
        with torch.inference_mode():
            got = rec.module(torch.from_numpy(x).to(rec.device, rec.dtype))[0].float().cpu()
        want = ref.session.run(None, {ref.input_name: x})[0]
        a = got.numpy()
        out["rel_error"] = float(np.linalg.norm(a - want) / np.linalg.norm(want))
        same = TextReader(ref, args.batch).read_crops(crops)
        out["same_text"] = sum(r.text == s.text for r, s in zip(read, same, strict=True))
        out["reference_texts"] = [s.text for s in same]
    return out


def _sample_crops(rng: np.random.Generator, n: int) -> list[U8Array]:
    """Label-like crops with known strings (OpenCV's Hershey font on light noise)."""
    crops: list[U8Array] = []
    for i in range(n):
        text = f"LOT {rng.integers(10000, 99999)}-{chr(65 + i % 26)}{i}"
        img = np.full((40, 12 + 19 * len(text), 3), 235, np.uint8)
        img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
        cv2.putText(img, text, (6, 30), cv2.FONT_HERSHEY_SIMPLEX, 0.9, (20, 20, 20), 2)
        crops.append(img)
    return crops


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m edge_vision.frames.read",
        description="Time the text recogniser (per frame and per box) on this machine; with "
        "--engine torch --compare, check the torch path against ONNX Runtime on the CPU.",
    )
    ap.add_argument("--engine", choices=["onnxruntime", "torch"], default="onnxruntime")
    ap.add_argument("--device", default="cuda:0", help="torch device (--engine torch)")
    ap.add_argument("--fp32", action="store_true", help="torch in FP32 (default FP16 on CUDA)")
    ap.add_argument("--model", default="", help="recogniser ONNX; default: rapidocr's")
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads; 0: cores")
    ap.add_argument("--boxes", type=int, default=8, help="crops read per frame")
    ap.add_argument("--batch", type=int, default=6, help="crops per recogniser run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compare", action="store_true", help="torch against ONNX Runtime")
    args = ap.parse_args(argv)
    print(json.dumps(_measure(args), indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
