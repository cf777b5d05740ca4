"""The textbook design, as a baseline: one ``websockets`` handler that decodes and runs the
model synchronously for every message, in arrival order — no off-loop work, no batching,
no dropping. It answers in the same message format so the same load generator measures
it. Run: ``python -m edge_vision.tools.bench.baseline --port 8765``.

It shares our model, letterbox and DB post-processing (so detections and per-frame cost
match); only the serving design differs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import struct
import time
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt


def _build(model_path: str | None, threads: int) -> Any:
    import onnxruntime as ort

    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...config import ModelConfig
    from ...model.heads import DbnetHead
    from ...model.shape import letterbox_into, normalise_into, plan_for_frame
    from ...model.spec import load_model_spec

    spec = load_model_spec(ModelConfig(path=model_path))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(spec.path), opts, providers=["CPUExecutionProvider"])
    head = DbnetHead()

    def infer(jpeg: bytes) -> tuple[int, int, list[dict[str, Any]], float]:
        t0 = time.perf_counter()
        img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError("not a decodable image")
        frame: npt.NDArray[np.uint8] = img.astype(np.uint8, copy=False)
        h, w = frame.shape[:2]
        lb = plan_for_frame(w, h, spec.limits)
        canvas = np.zeros((lb.out_h, lb.out_w, 3), np.uint8)
        letterbox_into(frame, lb, canvas, spec.pad_value)
        x = np.empty((1, 3, lb.out_h, lb.out_w), np.float32)
        normalise_into(x, [canvas], spec.normalisation)
        prob = session.run(None, {spec.input_name: x})[0]
        dets = head.decode([prob[0]], lb, 0.5)
        out = [
            {"box": [float(v) for v in d[:4]], "score": float(d[4]), "class": 0, "label": "text"}
            for d in dets
        ]
        return w, h, out, (time.perf_counter() - t0) * 1000.0

    return infer


async def serve(port: int, model_path: str | None, threads: int) -> None:
    import websockets

    infer = _build(model_path, threads)

    async def handler(ws: Any) -> None:
        # The fields a protocol 1 hello must have (docs/protocol.md), so the product's
        # client (bench.load's cameras) speaks to it; it answers every frame in order.
        hello = {
            "type": "hello",
            "protocol": 1,
            "model": "baseline",
            "session_id": "baseline",
            "resume_token": "",
            "settings": {"mode": "every", "confidence": 0.5, "classes": None},
        }
        await ws.send(json.dumps(hello))
        async for message in ws:
            if isinstance(message, bytes):
                (n,) = struct.unpack_from(">I", message)
                header = json.loads(message[4 : 4 + n])
                jpeg = message[4 + n :]
            else:
                header = json.loads(message)
                jpeg = base64.b64decode(header["image"].split(",")[-1])
            w, h, dets, ms = infer(jpeg)  # blocks the loop: the point of the baseline
            await ws.send(
                json.dumps(
                    {
                        "type": "result",
                        "id": header["id"],
                        "ts": header.get("ts"),
                        "width": w,
                        "height": h,
                        "detections": dets,
                        "timing": {"server_ms": ms},
                        "dropped": 0,
                    }
                )
            )

    async with websockets.serve(handler, "127.0.0.1", port, max_size=None, ping_interval=None):
        await asyncio.Future()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    import os

    asyncio.run(serve(a.port, a.model, a.threads or (os.cpu_count() or 1)))


if __name__ == "__main__":
    main()
