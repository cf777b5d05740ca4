#!/usr/bin/env python3
"""Round-trip overhead of the ``triton`` engine against the local ONNX Runtime engine.

Starts the test Triton (``tests/support/triton_server.py`` from ``.triton-venv``: a real
tritonserver 2.51 running the default model's network with ONNX Runtime in its Python
backend), then times ``engine.infer`` one batch at a time for batch 1 and 4 at 640x384 on
both engines, and splits Triton's time with its own statistics: queue and compute on the
server, the rest is the transport (normalise, serialise, gRPC, the Python-backend hop).

    scripts/setup-triton-env && python3 scripts/bench_triton.py [--batches 20]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_vision.config import ModelConfig
from edge_vision.engines.base import Engine
from edge_vision.engines.onnxruntime import OnnxRuntimeEngine
from edge_vision.engines.triton import TritonEngine
from edge_vision.model.spec import load_model_spec
from tests.support.server import make_config
from tests.support.triton import TritonProcess


async def time_pair(
    local: Engine, remote: Engine, frames: list[np.ndarray], n: int
) -> tuple[list[float], list[float]]:
    """Alternate the two engines batch by batch, so both see the same machine load."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for engine, out in ((local, times[0]), (remote, times[1])):
            t0 = time.perf_counter()
            await engine.infer(frames)
            out.append((time.perf_counter() - t0) * 1000)
    return times


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20, help="timed batches per case")
    args = ap.parse_args()
    spec = load_model_spec(ModelConfig())
    workdir = Path(tempfile.mkdtemp(prefix="bench-triton-"))
    triton = TritonProcess(workdir, spec.path)
    await asyncio.to_thread(triton.start)
    try:
        await asyncio.to_thread(triton.wait_ready)
        config = make_config(
            {"engine": {"kind": "triton", "triton": {"url": triton.url, "stats_interval_s": 0}}}
        )
        rng = np.random.default_rng(0)
        print(f"640x384, {args.batches} batches each, one in flight, alternating; ms")
        print("batch  onnxruntime  triton  overhead  triton queue  triton compute  transport")
        for b in (1, 4):
            frames = [rng.integers(0, 255, (384, 640, 3), dtype=np.uint8) for _ in range(b)]
            local, remote = OnnxRuntimeEngine(spec, config), TritonEngine(spec, config)
            await local.start()
            await remote.start()
            for _ in range(3):  # first runs of a shape pay allocation
                await local.infer(frames)
                await remote.infer(frames)
            stats0 = await asyncio.to_thread(_server_ns, triton)
            local_ms, remote_ms = await time_pair(local, remote, frames, args.batches)
            stats1 = await asyncio.to_thread(_server_ns, triton)
            await local.close()
            await remote.close()
            requests = stats1["requests"] - stats0["requests"]
            queue = (stats1["queue"] - stats0["queue"]) / requests / 1e6
            compute = (stats1["compute"] - stats0["compute"]) / requests / 1e6
            # Means throughout: Triton's statistics are sums, so they give means.
            lo, tr = statistics.mean(local_ms), statistics.mean(remote_ms)
            transport = tr - queue - compute
            print(
                f"{b:>5}  {lo:>11.1f}  {tr:>6.1f}  {tr - lo:>+8.1f}  {queue:>12.1f}  "
                f"{compute:>14.1f}  {transport:>9.1f}"
            )
    finally:
        await asyncio.to_thread(triton.stop)
        await asyncio.to_thread(shutil.rmtree, workdir, True)


def _server_ns(triton: TritonProcess) -> dict[str, int]:
    """Triton's cumulative request count and queue / compute nanoseconds for ppocr_det."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(triton.url)
    try:
        s = client.get_inference_statistics("ppocr_det").model_stats[0].inference_stats
    finally:
        client.close()
    compute = s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns
    return {"requests": s.success.count, "queue": s.queue.ns, "compute": compute}


if __name__ == "__main__":
    asyncio.run(main())
