"""What the device decode costs the host a frame (edge_vision.frames.decode_gpu), stage by stage.

On a GPU host the device decode's worker thread (``gpu-decode`` in the bench's CPU by
thread) took the largest share of the server's CPU at 64 cameras: 1.6 ms a frame on the
H200 (docs/benchmarks.md). This splits that figure with the GPU otherwise idle, one
process, one driver thread, at the small batches the service makes (2-3 frames at 64
cameras on 12 workers):

* ``decode``: the GPU JPEG library's batched call (``decode_pixels``) and the wait for its
  stream;
* ``letterbox``: the device letterbox of those decoded frames and the wait;
* ``decode_batch``: the whole call the service makes (routing, decode, letterbox, ready).

For each, per frame: wall milliseconds, the driver thread's CPU (``thread_time``: Python,
the library's calls, launches) and the rest of the process's CPU (``process_time`` less
the driver's: the library's own threads, CUDA's, torch's), so a library whose threads
spin shows in ``other_cpu_ms``. 1280×720 JPEGs of the load bench's camera clip, the
letterbox to 640×352 (the shape the service picks for them).

Without CUDA (``--device cpu``, the CI machine) only the letterbox runs, on torch's CPU
device, decoded by libjpeg-turbo: the same code the device runs, not the device's
figures. Run::

    python -m benchmarks.device_decode [--batches 1 2 3 4 8 16] [--seconds 1.5]
        [--libraries nvimgcodec torchvision] [--cpu-threads 1 2] [--backends hw+cuda hw cuda]
        [--device cuda:0] [--json out.json]

``--backends`` makes one nvImageCodec decoder of each: ``hw+cuda`` as a worker has, ``hw``
and ``cuda`` as the GPU process's two routes have. Each run also says how many batches the
library refused and how many frames went to libjpeg-turbo for it (``refused``:
``batches``, ``host_frames``): a decoder that refuses its frames measures the host, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simplejpeg

from edge_vision.frames.decode import read_image_header
from edge_vision.frames.decode_batch import DecodeRequest, HostBatchDecoder, Prepared
from edge_vision.frames.decode_gpu import CudaBatchDecoder
from edge_vision.model.shape import Letterbox, letterbox_into, plan_letterbox
from edge_vision.tools.bench.frames import generated_frames

PAD = 114


def _jpegs(count: int) -> list[bytes]:
    frames = generated_frames(1280, 720, count)
    return [simplejpeg.encode_jpeg(np.ascontiguousarray(f), 85, "RGB") for f in frames]


def _request(data: bytes, plan: Letterbox) -> DecodeRequest:
    return DecodeRequest(data, read_image_header(data), plan)


def _host_prepare(request: DecodeRequest) -> Prepared:
    """libjpeg-turbo and the host letterbox, for a frame the GPU library refuses."""
    lb = request.letterbox
    bgr = simplejpeg.decode_jpeg(request.data, colorspace="BGR")
    canvas = np.empty((lb.out_h, lb.out_w, 3), np.uint8)
    letterbox_into(bgr, lb, canvas, PAD)
    return Prepared(canvas, lb, 0.0, 0.0)


def _time(
    step: Callable[[int], None], batch: int, seconds: float, rounds_min: int = 5
) -> dict[str, float]:
    """``step(i)`` (one call of ``batch`` frames) again and again for ``seconds``: per
    frame, the median wall ms, the driver thread's CPU ms and the rest of the process's."""
    for i in range(3):
        step(i)  # first calls (allocations, library set-up) out of the figures
    walls: list[float] = []
    c_proc, c_thread = time.process_time(), time.thread_time()
    end, i = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or len(walls) < rounds_min:
        t0 = time.perf_counter()
        step(i)
        walls.append(time.perf_counter() - t0)
        i += 1
    thread = time.thread_time() - c_thread
    proc = time.process_time() - c_proc
    frames = len(walls) * batch
    return {
        "calls": len(walls),
        "wall_ms": float(np.median(walls)) * 1e3 / batch,
        "driver_cpu_ms": thread * 1e3 / frames,
        "other_cpu_ms": max(proc - thread, 0.0) * 1e3 / frames,
    }


def measure_library(
    dec: CudaBatchDecoder,
    jpegs: Sequence[bytes],
    plan: Letterbox,
    batches: Sequence[int],
    seconds: float,
    decode_on_host: bool,
) -> dict[str, Any]:
    """The three stages of ``dec`` (made with two streams: one held here for the first two
    stages, the other for ``decode_batch``) at each batch size; ``decode_on_host``: no GPU
    decode here (torch's CPU device), libjpeg-turbo decodes and only the letterbox is
    timed."""
    torch = dec._torch
    stream = dec._streams.get()

    def pick(i: int, b: int) -> list[bytes]:
        return [jpegs[(i * b + k) % len(jpegs)] for k in range(b)]

    def decoded(datas: Sequence[bytes]) -> list[Any]:
        if decode_on_host:
            return [
                torch.from_numpy(simplejpeg.decode_jpeg(d, colorspace="RGB")).permute(2, 0, 1)
                for d in datas
            ]
        images = dec.decode_pixels([_request(d, plan) for d in datas], stream)
        dec._wait(stream)
        return images

    def letterbox(images: list[Any]) -> None:
        with dec._on(stream):
            dec.letterbox(images, [plan] * len(images), PAD)
        dec._wait(stream)

    rows: dict[str, Any] = {}
    try:
        for b in batches:
            held = decoded(pick(0, b))
            failed = [h for h in held if isinstance(h, Exception)]
            if failed:  # the decoder refused them (one that did not start, for one)
                raise RuntimeError(f"{len(failed)} of {b} frames not decoded: {failed[0]}")

            def letterbox_only(_i: int, held: list[Any] = held) -> None:
                letterbox(held)

            row = {"letterbox": _time(letterbox_only, b, seconds)}
            if not decode_on_host:

                def decode_only(i: int, b: int = b) -> None:
                    decoded(pick(i, b))

                def whole(i: int, b: int = b) -> None:
                    # decode.device_wait host (the decoder's default): it returns once its
                    # stream has finished, as in the service
                    dec.decode_batch([_request(d, plan) for d in pick(i, b)])

                row["decode"] = _time(decode_only, b, seconds)
                row["decode_batch"] = _time(whole, b, seconds)
            rows[str(b)] = row
    finally:
        dec._streams.put(stream)
    return rows


def _backends(text: str) -> str:
    """``hw``, ``cuda`` or both joined by ``+`` (nvImageCodec's hardware JPEG engine and
    its CUDA decoder), else an error argparse reports in one line."""
    parts = text.split("+")
    if not parts or any(p not in ("hw", "cuda") for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give hw, cuda or hw+cuda")
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16])
    ap.add_argument("--seconds", type=float, default=1.5, help="per stage and batch size")
    ap.add_argument("--libraries", nargs="+", default=["nvimgcodec", "torchvision"])
    ap.add_argument(
        "--cpu-threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="nvImageCodec's host threads a decoder (the service gives 1 on 16 cores, 12 workers)",
    )
    ap.add_argument(
        "--backends",
        nargs="+",
        type=_backends,
        default=["hw+cuda"],
        help="nvImageCodec's backends a decoder: hw+cuda (a worker's), hw and cuda (the GPU "
        "process's two routes, gpu_process/decoders.py)",
    )
    ap.add_argument("--device", default=None, help="cuda:0 when torch sees a GPU, else cpu")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    jpegs = _jpegs(32)
    plan = plan_letterbox(1280, 720, 352, 640)
    host = HostBatchDecoder(_host_prepare, PAD)  # frames the GPU library refuses
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "device": device,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "frame": "1280x720 JPEG of the load bench's clip, letterboxed to 640x352",
        "runs": {},
        "refused": {},  # by run: batches the GPU library refused, frames libjpeg-turbo took
    }
    variants: list[tuple[str, str, int, tuple[str, ...]]] = []
    if cuda:
        for lib in args.libraries:
            threads = args.cpu_threads if lib == "nvimgcodec" else [args.cpu_threads[0]]
            for n in threads:
                if lib != "nvimgcodec":
                    variants.append((lib, lib, n, ("hw", "cuda")))
                    continue
                for b in args.backends:
                    backends = tuple(b.split("+"))
                    variants.append((f"{lib} {b} cpu_threads={n}", lib, n, backends))
    else:
        variants.append(("torch cpu letterbox (libjpeg-turbo decode)", "torchvision", 1, ()))
    for name, lib, n, backends in variants:
        print(f"-- {name}", flush=True)  # before anything of it can fail
        try:
            dec = CudaBatchDecoder(
                host,
                device=device,
                library=lib,
                cpu_threads=n,
                streams=2,
                backends=backends or ("hw", "cuda"),
            )
        except Exception as e:  # noqa: BLE001 - a library missing here: said, not fatal
            result["runs"][name] = {"error": repr(e)}
            print(f"{name}: {e!r}")
            continue
        try:
            rows = measure_library(dec, jpegs, plan, args.batches, args.seconds, not cuda)
        except RuntimeError as e:  # this decoder decodes nothing: said, the others go on
            result["runs"][name] = {"error": str(e), "warm_error": dec.warm_error}
            print(f"{name}: {e} (warm-up: {dec.warm_error})")
            continue
        # Frames the GPU library refused went to libjpeg-turbo: then the figures are the
        # host's, not the GPU decoder's.
        result["refused"][name] = {
            "batches": dec.refusals,  # decode_batch calls with frames sent to the host
            "host_frames": dec.host_frames,
            "batch_failures": dec.batch_failures,  # calls that failed whole, retried alone
        }
        result["runs"][name] = rows
        print(f"== {name} (refused: {result['refused'][name]})")
        print(f"{'batch':>5} {'stage':<13} {'wall ms':>8} {'driver CPU':>10} {'other CPU':>9}")
        for b, row in rows.items():
            for stage, r in row.items():
                print(
                    f"{b:>5} {stage:<13} {r['wall_ms']:8.3f} {r['driver_cpu_ms']:10.3f} "
                    f"{r['other_cpu_ms']:9.3f}"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
