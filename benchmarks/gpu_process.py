"""The GPU process's own Python a frame, with the GPU taken out: can one interpreter carry
a node's cameras?

    python -m benchmarks.gpu_process [--frames 6000] [--workers 4] [--in-flight 8]
        [--rounds 3] [--lines N] [--post worker|gpu] [--json out.json]

Issue 34 puts decode, the engine and post of every worker in one process a GPU. The GPU
does the work, but every frame still costs that process some Python: its submit message,
the copy out of the ring, the queue, the decode request and its batch, the engine batch,
post, the result. On an H100, 128 cameras at 30 fps are 3,840 frames a second, so the GPU
process's event loop has at most 260 µs a frame (docs/benchmarks.md, 2026-12-03, "The
hand-off to a node GPU process", asked this first). This bench measures it on any machine:
the real :class:`~edge_vision.gpu_process.process.GpuProcess` in a process of its own, with
a device decoder and an engine that do no work (each frame's letterboxed canvas is a
ready-made array, the engine answers DB's byte map of zeros at once, as the GPU engines'
device post would hand it) so that the decode batches, the engine's batches and post run
their real Python; ``--workers`` worker processes' worth of rings (in this process) keep
``--in-flight`` frames each in it, as the workers' sessions would. Reported: the GPU
process's CPU a frame, all of it and its event loop's alone (the thread every frame goes
through: the limit), and frames a second; the median of the rounds. ``--lines N`` makes
the engine's byte maps hold N text lines (benchmarks.post's maps), so post has real work;
``--post gpu`` has the GPU process post-process them itself instead of answering the
engine's outputs for the workers to post (the node's way; these workers do not post).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edge_vision.common.buffers import Allocator
from edge_vision.config import Config, load_config
from edge_vision.engines import Engine
from edge_vision.frames.decode_batch import DecodeRequest, Outcome, Prepared, device_decodable
from edge_vision.gpu_process import wire
from edge_vision.gpu_process.process import GpuProcess
from edge_vision.gpu_process.ring import Record, RingWriter, Segment
from edge_vision.model.spec import ModelSpec, load_model_spec
from edge_vision.tools.bench.frames import encode_jpegs, generated_frames
from edge_vision.tools.bench.load import cpu_by_role, thread_cpu_seconds
from edge_vision.tools.bench.servers import medians, write_report


class InstantEngine(Engine):
    """A GPU engine's answers without a GPU: DB's byte map, all below the threshold, or
    (``maps``) made beforehand from maps of text lines (benchmarks.post), cycled."""

    kind = "torch"
    maps: ClassVar[list[np.ndarray]] = []
    served = 0  # frames answered: where in ``maps`` the next one starts

    async def start(self) -> None:
        pass

    @property
    def accepts_device_frames(self) -> bool:
        return True

    async def infer(self, frames: Sequence[Any]) -> list[np.ndarray]:
        h, w = frames[0].shape[:2]
        if not self.maps or self.maps[0].shape[-2:] != (h, w):
            return [np.zeros((len(frames), 1, h, w), np.uint8)]
        pick = [self.maps[(self.served + i) % len(self.maps)] for i in range(len(frames))]
        self.served += len(frames)
        return [np.concatenate(pick)]

    async def close(self) -> None:
        pass


class InstantDecoder:
    """A device decoder's answers without a GPU: a ready letterboxed canvas a frame."""

    name = "instant"
    device = "none"
    library = "none"

    def __init__(self) -> None:
        self._canvas: dict[tuple[int, int], np.ndarray] = {}

    def takes(self, request: DecodeRequest) -> bool:
        return device_decodable(request)

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        out: list[Outcome] = []
        for r in requests:
            lb = r.letterbox
            canvas = self._canvas.get(lb.shape)
            if canvas is None:
                canvas = self._canvas[lb.shape] = np.zeros((lb.out_h, lb.out_w, 3), np.uint8)
            out.append(Prepared(canvas, lb, 0.0, 0.0, on_device=True))
        return out

    def set_staging_allocator(self, allocator: Allocator) -> None:
        pass


def _config() -> Config:
    return load_config(
        None,
        environ={},
        cli={
            "engine": {"max_batch": 16, "in_flight": 3, "warmup_shapes": [[720, 1280]]},
            "decode": {"device": "cuda", "device_batch": 64, "device_streams": 2},
            "session": {"latest_in_flight": 2},
        },
    )


def text_maps(lines: int, count: int = 16) -> list[np.ndarray]:
    """``count`` byte maps ``[1, 1, 352, 640]`` of ``lines`` text lines each, as the GPU
    engines' device post answers a 1280x720 frame (needs torch, on the CPU)."""
    from .post import byte_map, prob_map

    threshold = load_config(None, environ={}).model.dbnet.bin_threshold
    return [byte_map(prob_map(lines, seed), threshold) for seed in range(count)]


def _gpu_main(path: str, lines: int = 0) -> None:
    if lines:
        InstantEngine.maps = text_maps(lines)
    config = _config()
    spec: ModelSpec = load_model_spec(config.model)
    process = GpuProcess(
        config, stand_in=False, spec=spec, engine_factory=lambda k, s, c: InstantEngine(s, c)
    )
    process.pipeline.decoding.device = InstantDecoder()
    asyncio.run(process.run(path))


async def _worker(
    path: str, index: int, frames: int, in_flight: int, jpeg: bytes, raw: bool
) -> None:
    """One worker's ring and connection, ``in_flight`` frames in the GPU process at once."""
    segment = Segment.create("gpu-process-bench", f"w{index}", 32 << 20)
    ring = RingWriter(segment)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, path)
    socket.send_fds(sock, [wire.Hello(index, os.getpid(), ring.capacity).encode()], [segment.fd])
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    records: dict[int, Record] = {}
    sent = answered = 0

    def submit() -> None:
        nonlocal sent
        record = ring.put(jpeg, sent)
        if record is None:
            raise RuntimeError("the ring is full")
        records[sent] = record
        # every session of its own, so none replaces another's frame
        sub = wire.Submit(sent, record, sent % 1000, False, False, 0.5, None, None, raw)
        writer.write(sub.encode())
        sent += 1

    try:
        while True:  # the GPU process says it is ready before it takes a frame
            kind, body = await wire.read_message(reader)
            if kind == wire.STATUS and wire.decode_status(body)["ready"]:
                break
        for _ in range(min(in_flight, frames)):
            submit()
        while answered < frames:
            kind, body = await wire.read_message(reader)
            if kind != wire.RESULT:
                continue
            result = wire.Result.decode(body)
            if result.outcome != "ok":
                raise RuntimeError(f"frame {result.seq}: {result.outcome} {result.error_message}")
            ring.free(records.pop(result.seq))
            answered += 1
            if sent < frames:
                submit()
    finally:
        writer.close()
        segment.close()


async def _drive(path: str, args: argparse.Namespace, jpeg: bytes, frames: int) -> None:
    each = frames // args.workers
    await asyncio.gather(
        *(
            _worker(path, i, each, args.in_flight, jpeg, args.post == "worker")
            for i in range(args.workers)
        )
    )


def one_round(args: argparse.Namespace, tmp: Path, jpeg: bytes, r: int) -> dict[str, Any]:
    path = str(tmp / f"gpu-{r}.sock")
    gpu = multiprocessing.get_context("spawn").Process(target=_gpu_main, args=(path, args.lines))
    gpu.start()
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > deadline or not gpu.is_alive():
                raise RuntimeError("the GPU process did not start")
            time.sleep(0.05)
        time.sleep(0.5)
        asyncio.run(_drive(path, args, jpeg, 200 * args.workers))  # warm: batches, graphs
        assert gpu.pid is not None
        before, t0 = thread_cpu_seconds(gpu.pid), time.perf_counter()
        asyncio.run(_drive(path, args, jpeg, args.frames))
        wall = time.perf_counter() - t0
        roles = cpu_by_role(before, thread_cpu_seconds(gpu.pid))
    finally:
        gpu.terminate()
        gpu.join(30)
        if gpu.is_alive():
            gpu.kill()
    frames = args.frames // args.workers * args.workers
    return {
        "round": r,
        "frames": frames,
        "gpu_process_cpu_us_per_frame": sum(roles.values()) / frames * 1e6,
        "loop_cpu_us_per_frame": roles.get("loop", 0.0) / frames * 1e6,
        "frames_per_s": frames / wall,
        "cpu_by_role_s": {k: round(v, 3) for k, v in roles.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_process",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--frames", type=int, default=6000, help="frames a round")
    ap.add_argument("--workers", type=int, default=4, help="workers' rings and connections")
    ap.add_argument("--in-flight", type=int, default=8, help="frames a worker keeps in it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--lines",
        type=int,
        default=0,
        help="text lines in each frame's DB map (0: an empty map, post does almost nothing)",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--post",
        choices=("worker", "gpu"),
        default="worker",
        help="who post-processes: the workers (the node's way: the GPU process answers the "
        "engine's outputs; this bench's workers do not post them) or the GPU process",
    )
    args = ap.parse_args(argv)
    jpeg = encode_jpegs(generated_frames(1280, 720, 1))[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpu-process-bench-") as tmp:
        for r in range(args.rounds):
            run = one_round(args, Path(tmp), jpeg, r)
            runs.append(run)
            print(
                f"round {r}: GPU process {run['gpu_process_cpu_us_per_frame']:6.0f} µs a frame "
                f"(event loop {run['loop_cpu_us_per_frame']:5.0f}), "
                f"{run['frames_per_s']:6.0f} frames/s; {run['cpu_by_role_s']}",
                flush=True,
            )
    keys = ("gpu_process_cpu_us_per_frame", "loop_cpu_us_per_frame", "frames_per_s")
    summary = medians([{**r, "all": "all"} for r in runs], "all", keys)["all"]
    print(
        f"\nmedian of {args.rounds} rounds: GPU process {summary[keys[0]]:.0f} µs a frame, "
        f"its event loop {summary[keys[1]]:.0f} µs, {summary[keys[2]]:.0f} frames/s"
    )
    if args.json:
        write_report(args.json, runs, {"all": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
