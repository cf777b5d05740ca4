"""Hand-off bench: what passing frames to another process of the node costs the host, a
frame, by how many frames one message carries.

    python -m benchmarks.handoff [--frames 20000] [--batches 1,2,4,8,16]
        [--bytes 90000] [--reply-bytes 225280] [--rounds 3] [--json out.json]
        [--transport slots|ring]

The lever left for issue 11 (docs/benchmarks.md, 2026-12-03 "morning") is one process a
node owning the GPU, decoding and inferring the frames of every worker in one call, so a
call carries 8-16 frames instead of each worker's 2-3. Before that is built, this bench
measures what the hand-off itself would cost: a "worker" process (an asyncio loop, as a
serving worker is) copies each frame's bytes (``--bytes``, a 1280x720 JPEG) into a slot of
shared memory and sends the batch's slot numbers over a Unix socket; a stand-in for the GPU
process (no GPU work) reads the numbers, touches each frame's first and last byte, and
answers with the slots of the replies (``--reply-bytes``, DB's byte map at 640x352), whose
first and last bytes the worker reads. That is the design's minimum: the GPU process's
copies to and from the device would read and write the shared memory directly (registered
as pinned), so no other copy is counted. The CPU seconds of each process (user + system,
from getrusage) are divided by the frames; the batch sizes alternate over the rounds and the
median round is reported.

``--transport ring`` (issue 34) measures the hand-off as built instead of its minimum: the
product's own ring and control messages (edge_vision/gpu_process/: ``RingWriter`` in a
worker segment of /dev/shm made as a worker makes it, handed to the GPU process's stand-in
as a file descriptor over the Unix socket, one ``SUBMIT`` message a frame; the stand-in
copies each frame out with ``RingReader`` and answers one ``RESULT`` a frame with two
detections, which the worker decodes before it frees the record). ``--batches`` is then
the frames one worker has in flight at once, sent before their answers are read.

Compare the figures with the GPU path's host CPU a frame in docs/benchmarks.md (2.86 ms at
64 cameras with a 12 ms decode window on the H200): the hand-off pays where its cost a frame
is well under what fuller calls save. Run it on the machine in question: a Jetson's cores
are slower than this bench's defaults assume.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import socket
import struct
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from edge_vision.gpu_process import wire
from edge_vision.gpu_process.ring import Record, RingReader, RingWriter, Segment
from edge_vision.tools.bench.servers import medians, write_report

_COUNT = struct.Struct("<I")
_CPU = struct.Struct("<d")


def _cpu_now() -> float:
    """This process's CPU seconds so far, user + system, every thread (getrusage: to the
    microsecond, where /proc counts 10 ms ticks)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _buffer(shm: shared_memory.SharedMemory) -> memoryview:
    if shm.buf is None:  # closed
        raise RuntimeError("the shared memory is closed")
    return shm.buf


def _slot_offsets(slots: int, size: int, reply: int) -> tuple[list[int], list[int]]:
    frames = [i * size for i in range(slots)]
    replies = [slots * size + i * reply for i in range(slots)]
    return frames, replies


async def _serve_gpu(path: str, shm_name: str, slots: int, size: int, reply: int) -> None:
    """The GPU process's stand-in: answers each batch of slot numbers with the same."""
    shm = shared_memory.SharedMemory(name=shm_name)
    buf = _buffer(shm)
    frames, replies = _slot_offsets(slots, size, reply)
    done = asyncio.Event()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Its own CPU from the first batch to the last, sent back at the end.
        start: float | None = None
        try:
            while True:
                head = await reader.readexactly(_COUNT.size)
                (n,) = _COUNT.unpack(head)
                if start is None:
                    start = _cpu_now()
                if n == 0:
                    writer.write(_CPU.pack(_cpu_now() - start))
                    await writer.drain()
                    break
                body = await reader.readexactly(4 * n)
                ids = struct.unpack(f"<{n}I", body)
                for i in ids:  # the upload would read the frame where it lies
                    off = frames[i]
                    buf[replies[i]] = buf[off] ^ buf[off + size - 1]
                writer.write(head + body)
                await writer.drain()
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_unix_server(one, path)
    async with server:
        await done.wait()
    shm.close()


def _gpu_main(path: str, shm_name: str, slots: int, size: int, reply: int) -> None:
    asyncio.run(_serve_gpu(path, shm_name, slots, size, reply))


async def _drive(
    path: str, buf: memoryview, frames: int, batch: int, size: int, reply: int, payload: bytes
) -> float:
    """The worker's side: ``frames`` frames in messages of ``batch``, one in flight; returns
    the GPU process's CPU seconds for them."""
    frame_at, reply_at = _slot_offsets(batch, size, reply)
    expect = payload[0] ^ payload[-1]  # what the stand-in writes from each frame
    reader, writer = await asyncio.open_unix_connection(path)
    sent = 0
    while sent < frames:
        n = min(batch, frames - sent)
        for i in range(n):  # the frame's bytes, from its WebSocket message into its slot
            buf[frame_at[i] : frame_at[i] + size] = payload
        ids = struct.pack(f"<I{n}I", n, *range(n))
        writer.write(ids)
        await writer.drain()
        back = await reader.readexactly(len(ids))
        for i in struct.unpack(f"<{n}I", back[_COUNT.size :]):  # post reads its map
            if buf[reply_at[i]] != expect or buf[reply_at[i] + reply - 1] != 0:
                raise RuntimeError(f"slot {i}: the reply is not the frame's")
        sent += n
    writer.write(_COUNT.pack(0))
    await writer.drain()
    (gpu_cpu,) = _CPU.unpack(await reader.readexactly(_CPU.size))
    writer.close()
    await writer.wait_closed()
    return float(gpu_cpu)


async def _serve_ring(path: str) -> None:
    """The GPU process's stand-in for ``--transport ring``: the product's messages, each
    frame copied out of the ring, a result of two detections a frame."""
    done = asyncio.Event()
    dets = np.array([[10, 20, 300, 60, 0.9, 0], [40, 200, 500, 240, 0.8, 0]], np.float32)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    conn, _ = await asyncio.to_thread(listener.accept)
    body, fds, _flags, _addr = socket.recv_fds(conn, wire.FRAME.size + 16, 1)
    segment = Segment.attach(fds[0])
    ring = RingReader(segment)
    conn.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=conn)
    start: float | None = None
    try:
        while True:
            kind, body = await wire.read_message(reader)
            if start is None:
                start = _cpu_now()
            if kind == wire.CANCEL:  # the end: its CPU seconds go back
                writer.write(wire.status({"cpu_s": _cpu_now() - start}))
                await writer.drain()
                break
            sub = wire.Submit.decode(body)
            if ring.read(sub.record) is None:
                raise RuntimeError(f"frame {sub.seq} was not whole in the ring")
            writer.write(wire.Result(sub.seq, "ok", dets).encode())  # no drain: as the product
    finally:
        writer.close()
        segment.close()
        listener.close()
        done.set()


def _ring_main(path: str) -> None:
    asyncio.run(_serve_ring(path))


async def _drive_ring(path: str, frames: int, batch: int, payload: bytes) -> float:
    """The worker's side with the product's ring: ``batch`` frames in flight at once;
    returns the stand-in's CPU seconds."""
    segment = Segment.create("handoff-bench", "w0", 4 * max(len(payload), 1 << 20))
    ring = RingWriter(segment)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    for _ in range(300):  # the path appears at bind, a moment before listen
        try:
            await loop.sock_connect(sock, path)
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.01)
    socket.send_fds(sock, [wire.Hello(0, os.getpid(), ring.capacity).encode()], [segment.fd])
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    records: dict[int, Record] = {}
    sent = 0
    try:
        while sent < frames:
            n = min(batch, frames - sent)
            for i in range(n):
                seq = sent + i
                record = ring.put(payload, seq)
                if record is None:
                    raise RuntimeError("the ring is full")
                records[seq] = record
                sub = wire.Submit(seq, record, 1, True, False, 0.5, None, None)
                writer.write(sub.encode())
            for _ in range(n):
                kind, body = await wire.read_message(reader)
                result = wire.Result.decode(body)
                if kind != wire.RESULT or len(result.detections) != 2:
                    raise RuntimeError(f"frame {result.seq}: not its result")
                ring.free(records.pop(result.seq))
            sent += n
        writer.write(wire.cancel(0))
        _kind, body = await wire.read_message(reader)
        return float(wire.decode_status(body)["cpu_s"])
    finally:
        writer.close()
        segment.close()


def one_ring_round(batch: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One batch size with the product's ring: the worker's and the stand-in's CPU."""
    path = str(tmp / f"ring-{batch}-{time.monotonic_ns()}.sock")
    gpu = multiprocessing.get_context("spawn").Process(target=_ring_main, args=(path,))
    gpu.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if time.monotonic() > deadline or not gpu.is_alive():
                raise RuntimeError("the GPU process stand-in did not start")
            time.sleep(0.01)
        payload = bytes(range(256)) * (args.bytes // 256) + bytes(args.bytes % 256)
        worker0, t0 = _cpu_now(), time.perf_counter()
        gpu_cpu = asyncio.run(_drive_ring(path, args.frames, batch, payload))
        wall, worker_cpu = time.perf_counter() - t0, _cpu_now() - worker0
        gpu.join(30)
    finally:
        if gpu.is_alive():
            gpu.kill()
    return {
        "batch": batch,
        "frames": args.frames,
        "transport": "ring",
        "worker_cpu_us_per_frame": worker_cpu / args.frames * 1e6,
        "gpu_process_cpu_us_per_frame": gpu_cpu / args.frames * 1e6,
        "frames_per_s": args.frames / wall,
    }


def one_round(batch: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One batch size: the worker's and the GPU process's CPU a frame."""
    size, reply = args.bytes, args.reply_bytes
    shm = shared_memory.SharedMemory(create=True, size=batch * (size + reply))
    path = str(tmp / f"gpu-{batch}-{time.monotonic_ns()}.sock")
    spawn = multiprocessing.get_context("spawn")
    gpu = spawn.Process(target=_gpu_main, args=(path, shm.name, batch, size, reply))
    gpu.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if time.monotonic() > deadline or not gpu.is_alive():
                raise RuntimeError("the GPU process stand-in did not start")
            time.sleep(0.01)
        payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
        worker0, t0 = _cpu_now(), time.perf_counter()
        gpu_cpu = asyncio.run(_drive(path, _buffer(shm), args.frames, batch, size, reply, payload))
        wall, worker_cpu = time.perf_counter() - t0, _cpu_now() - worker0
        gpu.join(30)
    finally:
        if gpu.is_alive():
            gpu.kill()
        shm.close()
        shm.unlink()
    return {
        "batch": batch,
        "frames": args.frames,
        "worker_cpu_us_per_frame": worker_cpu / args.frames * 1e6,
        "gpu_process_cpu_us_per_frame": gpu_cpu / args.frames * 1e6,
        "frames_per_s": args.frames / wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.handoff",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--frames", type=int, default=20_000, help="frames a round")
    ap.add_argument("--batches", default="1,2,4,8,16", help="frames a message")
    ap.add_argument("--bytes", type=int, default=90_000, help="bytes a frame (a JPEG)")
    ap.add_argument(
        "--reply-bytes", type=int, default=640 * 352, help="bytes a reply (DB's byte map)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the batch order alternating")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--transport",
        choices=("slots", "ring"),
        default="slots",
        help="slots: the minimum (fixed slots, slot numbers); ring: the product's ring and "
        "messages (edge_vision/gpu_process)",
    )
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="handoff-bench-") as tmp:
        for r in range(args.rounds):
            for batch in batches if r % 2 == 0 else batches[::-1]:
                round_of = one_ring_round if args.transport == "ring" else one_round
                run = round_of(batch, args, Path(tmp))
                runs.append({"round": r, **run})
                print(
                    f"round {r} batch {batch:3d}: worker {run['worker_cpu_us_per_frame']:6.1f} µs, "
                    f"GPU process {run['gpu_process_cpu_us_per_frame']:6.1f} µs a frame, "
                    f"{run['frames_per_s']:7.0f} frames/s",
                    flush=True,
                )
    keys = ("worker_cpu_us_per_frame", "gpu_process_cpu_us_per_frame", "frames_per_s")
    summary = medians(runs, "batch", keys)
    print(f"\nmedian of {args.rounds} rounds, {args.frames} frames of {args.bytes:,} bytes each:")
    for b, s in summary.items():
        print(
            f"  batch {int(b):3d}: worker {s['worker_cpu_us_per_frame']:6.1f} µs + GPU process "
            f"{s['gpu_process_cpu_us_per_frame']:6.1f} µs a frame"
        )
    if args.json:
        write_report(args.json, runs, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
