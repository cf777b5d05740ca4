"""ONNX Runtime's intra-op thread count on the CPU: frames/s of the engine alone, in one run.

Three ways to spend the machine's cores on the default model at one input shape (a 16:9
frame at ``--size``), run in interleaved rounds so a shared machine's load falls on all
alike:

* ``2 threads × 1 stream``: one session with ``--threads`` intra-op threads, frames one
  after another (today's default on 2 cores);
* ``1 thread × 1 stream``: one single-threaded session, frames one after another;
* ``1 thread × N streams``: ``N`` (= ``--threads``) single-threaded sessions, each fed by
  its own Python thread at once (ONNX Runtime releases the GIL), as N cameras would be
  served by N one-thread engines.

Engine only (no decode, no post, no server): it tells which way the cores give more frames
per second, not what a loaded server answers. Run::

    python -m benchmarks.threads [--size 640] [--threads 2] [--seconds 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

from edge_vision.config import ModelConfig
from edge_vision.model.shape import choose_input_shape
from edge_vision.model.spec import load_model_spec


def _session(path: str, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _run_for(session: Any, feed: dict[str, Any], seconds: float, out: list[float]) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        session.run(None, feed)
        out.append(time.perf_counter() - t0)


def measure(size: int, threads: int, seconds: float, rounds: int) -> dict[str, Any]:
    spec = load_model_spec(ModelConfig())
    h, w = choose_input_shape(16 * size, 9 * size, spec.limits)
    x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
    feed = {spec.input_name: x}
    multi = _session(str(spec.path), threads)
    singles = [_session(str(spec.path), 1) for _ in range(threads)]
    for s in (multi, *singles):
        s.run(None, feed)  # first-run cost out of the figures
    names = [
        f"{threads} threads x 1 stream",
        "1 thread x 1 stream",
        f"1 thread x {threads} streams",
    ]
    frames: dict[str, int] = dict.fromkeys(names, 0)
    lat: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, float] = dict.fromkeys(names, 0.0)
    for _ in range(rounds):
        for name in names:
            t0 = time.perf_counter()
            if name == names[2]:
                per: list[list[float]] = [[] for _ in singles]
                workers = [
                    threading.Thread(target=_run_for, args=(s, feed, seconds, per[i]))
                    for i, s in enumerate(singles)
                ]
                for t in workers:
                    t.start()
                for t in workers:
                    t.join()
                got = [v for p in per for v in p]
            else:
                got = []
                _run_for(multi if name == names[0] else singles[0], feed, seconds, got)
            wall[name] += time.perf_counter() - t0
            frames[name] += len(got)
            lat[name] += got
    return {
        "input": f"{w}x{h}",
        "rows": [
            {
                "way": n,
                "frames_per_s": round(frames[n] / wall[n], 2),
                "latency_median_ms": round(float(np.median(lat[n])) * 1e3, 1),
                "latency_p99_ms": round(float(np.percentile(lat[n], 99)) * 1e3, 1),
            }
            for n in names
        ],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0, help="per way and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.size, args.threads, args.seconds, args.rounds), indent=1))


if __name__ == "__main__":
    main()
