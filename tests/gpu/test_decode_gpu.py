"""Batched JPEG decode on the GPU (nvJPEG through torchvision) and the device letterbox:
pixels against libjpeg-turbo, letterbox against the host's, detections against the host
path, one corrupt JPEG in a batch, stream ordering under concurrent load, and memory over
10,000 frames. Runs on a CUDA machine with the torch engine (cuda-python CUDA layer)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np
import pytest
import simplejpeg

from edge_vision.common.messages import FrameMessage
from edge_vision.config import Config
from edge_vision.errors import ClientError
from edge_vision.frames.decode_batch import DecodeRequest, Prepared
from edge_vision.frames.decode_gpu import CudaBatchDecoder
from edge_vision.frames.infer import InferenceService
from edge_vision.frames.pipeline import FramePipeline, FrameSettings
from edge_vision.model.shape import letterbox_into
from edge_vision.model.spec import ModelSpec

from ..support.assertions import iou
from ..support.images import text_scene
from .conftest import backend_installed

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not backend_installed("cuda-python"), reason="cuda-python is not installed here"
    ),
]


def _config(decode_device: str, **engine: Any) -> Config:
    from ..support.server import make_config

    base: dict[str, Any] = {
        "kind": "torch",
        "fallback": "none",
        "max_batch": 16,
        "in_flight": 3,
        "cuda_backend": "cuda-python",
        "warmup_shapes": [[720, 1280]],  # a 16:9 camera frame
        "torch": {"device": "cuda:0", "fp16": True, "cuda_graphs": True},
    }
    base.update(engine)
    return make_config({"engine": base, "decode": {"device": decode_device}})


def _msg(i: int, data: bytes) -> FrameMessage:
    return FrameMessage(i, 0.0, data, False, time.perf_counter())


def _corrupt(data: bytes) -> bytes:
    """The JPEG with its first Huffman table's code counts made impossible: the header
    still reads (size, SOF), every decoder refuses the table."""
    i = data.index(b"\xff\xc4")
    return data[: i + 5] + b"\xff" * 16 + data[i + 21 :]


class _Served:
    """A started torch engine service and its pipeline (decode.device as given)."""

    def __init__(self, spec: ModelSpec, decode_device: str, wait: str = "host") -> None:
        self.cfg = _config(decode_device)
        self.service = InferenceService(spec, self.cfg)
        self.wait = wait  # who waits for the decoder's stream: the service runs host

    async def __aenter__(self) -> FramePipeline:
        await self.service.start()
        self.pipeline = FramePipeline(self.cfg, self.service)
        device = self.pipeline.decoding.device
        if isinstance(device, CudaBatchDecoder):
            device.wait = self.wait
        return self.pipeline

    async def __aexit__(self, *exc: object) -> None:
        await self.pipeline.close()
        await self.service.close()


def _device(pipeline: FramePipeline) -> CudaBatchDecoder:
    dec = pipeline.decoding.device
    assert isinstance(dec, CudaBatchDecoder), "the GPU decoder is not active"
    return dec


def _req(pipeline: FramePipeline, data: bytes) -> DecodeRequest:
    return pipeline.request_for(_msg(0, data))


async def test_nvjpeg_pixels_and_device_letterbox_match_libjpeg_turbo_and_the_host(
    spec: ModelSpec,
) -> None:
    sizes = [(1280, 720), (1920, 1080), (640, 480), (320, 240), (720, 1280)]
    scenes = [text_scene(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    jpegs = [s.jpeg() for s in scenes]
    async with _Served(spec, "cuda") as pipeline:
        dec = _device(pipeline)
        stream = torch.cuda.Stream()
        pixels = await asyncio.to_thread(
            dec.decode_pixels, [_req(pipeline, j) for j in jpegs], stream
        )
        stream.synchronize()
        for data, px in zip(jpegs, pixels, strict=True):
            ref = simplejpeg.decode_jpeg(data, colorspace="RGB").astype(np.int16)
            got = px.permute(1, 2, 0).cpu().numpy().astype(np.int16)
            diff = np.abs(got - ref)
            print(f"nvJPEG vs libjpeg-turbo {ref.shape}: mean {diff.mean():.3f} max {diff.max()}")
            assert got.shape == ref.shape
            assert diff.mean() <= 2 and diff.max() <= 16
        out = await asyncio.to_thread(dec.decode_batch, [_req(pipeline, j) for j in jpegs])
        pad = spec.pad_value
        for data, o in zip(jpegs, out, strict=True):
            assert isinstance(o, Prepared) and o.on_device
            lb = o.letterbox
            got = o.canvas.host().astype(np.int16)
            # The letterbox itself: the host's (cv2 INTER_AREA / INTER_LINEAR) of the same
            # full-size pixels.
            ref = np.empty((lb.out_h, lb.out_w, 3), np.uint8)
            letterbox_into(simplejpeg.decode_jpeg(data, colorspace="BGR"), lb, ref, pad)
            diff = np.abs(got - ref)
            # And the whole host path, whose libjpeg scales big frames by 1/2..1/8 in the
            # IDCT first: reported, not held to the letterbox's tolerance.
            host = pipeline.host_decoder.decode_one(_req(pipeline, data))
            path = np.abs(got - host.canvas.astype(np.int16))
            pipeline.pool.release(host.canvas)
            print(
                f"device vs host letterbox {lb.src_w}x{lb.src_h} -> {lb.out_w}x{lb.out_h}: "
                f"mean {diff.mean():.3f} max {diff.max()}; vs the host path with DCT "
                f"downscale: mean {path.mean():.3f} max {path.max()}"
            )
            assert o.letterbox == host.letterbox and got.shape == ref.shape
            assert diff.mean() <= 2


async def test_detections_with_gpu_decode_equal_the_host_path_and_a_corrupt_jpeg_fails_alone(
    spec: ModelSpec,
) -> None:
    scenes = [
        text_scene(
            1280, 720, texts=[("SERIAL 4711-AB", (200, 250)), ("LOT 0042", (700, 520))], seed=s
        )
        for s in range(4)
    ]
    jpegs = [s.jpeg() for s in scenes]
    jpegs.insert(2, _corrupt(jpegs[0]))
    found: dict[str, list[Any]] = {}
    for where in ("host", "cuda"):
        async with _Served(spec, where) as pipeline:
            results = await asyncio.gather(
                *(pipeline.process(_msg(i, d), FrameSettings(0.5)) for i, d in enumerate(jpegs)),
                return_exceptions=True,
            )
            if where == "cuda":
                dec = _device(pipeline)
                print(
                    f"device frames {dec.device_frames}, host frames {dec.host_frames}, "
                    f"whole-batch failures {dec.batch_failures}"
                )
                assert dec.device_frames >= 4
        bad = results.pop(2)
        assert isinstance(bad, ClientError) and bad.code == "bad_image", bad
        assert not any(isinstance(r, BaseException) for r in results), results
        found[where] = [[d[:4].tolist() for d in r.detections] for r in results]  # type: ignore[union-attr]
    for host_boxes, gpu_boxes in zip(found["host"], found["cuda"], strict=True):
        assert len(gpu_boxes) == len(host_boxes) >= 2
        for b in host_boxes:
            assert max(iou(b, g) for g in gpu_boxes) >= 0.9, (b, gpu_boxes)


@pytest.mark.parametrize("wait", ["host", "stream"])  # CudaBatchDecoder.wait
async def test_inputs_queued_on_engine_streams_are_never_overwritten_by_a_decode(
    spec: ModelSpec, wait: str
) -> None:
    """Under concurrent load, with callers that go away mid-flight (their canvases freed
    while the engine may still have copies of them queued), every row each batch's graph
    read equals the canvas of the frame that was put there, computed alone beforehand;
    with the decode thread waiting for its stream, and with the engine's stream waiting
    for each canvas's event instead."""
    jpegs = [
        text_scene(1280, 720, texts=[(f"FRAME {i:03d}", (300, 300))], seed=i).jpeg()
        for i in range(24)
    ]
    async with _Served(spec, "cuda", wait) as pipeline:
        dec = _device(pipeline)
        engine: Any = pipeline.service.engine
        expected = []
        for d in jpegs:
            (o,) = await asyncio.to_thread(dec.decode_batch, [_req(pipeline, d)])
            assert isinstance(o, Prepared)
            expected.append(o.canvas.host())
        which: dict[int, int] = {}  # id(canvas) -> frame index, while the canvas lives
        by_bytes = {d: i for i, d in enumerate(jpegs)}
        decode_batch = dec.decode_batch

        def recording_decode(requests: list[DecodeRequest]) -> list[Any]:
            out = decode_batch(requests)
            for r, o in zip(requests, out, strict=True):
                if isinstance(o, Prepared):
                    which[id(o.canvas)] = by_bytes[r.data]
            return out

        snaps: list[tuple[Any, list[int]]] = []
        upload = engine._upload_frames

        def snapshot_upload(base: int, frames: list[Any], slot: Any, into: Any = None) -> None:
            upload(base, frames, slot, into=into)
            g = next(g for g in slot.graphs.values() if g.static_in.data_ptr() == base)
            with torch.cuda.stream(slot.torch_stream):  # after the copies, on their stream
                rows = g.static_in[: len(frames)].clone()
            # -1: not a device canvas (keep-warm's zero frames, frames decoded on the host)
            snaps.append(
                (rows, [-1 if isinstance(f, np.ndarray) else which.get(id(f), -1) for f in frames])
            )

        dec.decode_batch = recording_decode  # type: ignore[method-assign]
        engine._upload_frames = snapshot_upload
        rng = random.Random(7)

        async def one(i: int) -> None:
            await pipeline.process(_msg(i, jpegs[i % len(jpegs)]), FrameSettings(0.5))

        for wave in range(20):
            tasks = [asyncio.create_task(one(wave * 64 + k)) for k in range(64)]
            await asyncio.sleep(rng.uniform(0, 0.004))
            for t in rng.sample(tasks, 8):  # callers gone mid-flight
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        torch.cuda.synchronize()
    rows = 0
    for snap, idx in snaps:
        host = snap.cpu().numpy()
        for row, i in zip(host, idx, strict=True):
            if i < 0:
                continue
            diff = np.abs(row.astype(np.int16) - expected[i])
            assert diff.max() <= 2, f"batch input row of frame {i} was overwritten"
            rows += 1
    print(f"stream ordering: {len(snaps)} batches, {rows} rows checked against host copies")
    assert rows > 500


async def test_pinned_and_device_memory_stay_flat_over_10000_frames(spec: ModelSpec) -> None:
    jpegs = [text_scene(1280, 720, seed=i).jpeg() for i in range(16)]
    async with _Served(spec, "cuda") as pipeline:
        dec = _device(pipeline)

        async def frames(n: int, start: int) -> None:
            for w in range(0, n, 64):
                await asyncio.gather(
                    *(
                        pipeline.process(_msg(start + w + k, jpegs[k % 16]), FrameSettings(0.5))
                        for k in range(64)
                    )
                )

        await frames(1024, 0)  # warm: every pool, graph and allocator block in place
        torch.cuda.synchronize()
        before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        pinned_before = (pipeline.pool.allocations, dec.staging.allocations)
        t0 = time.perf_counter()
        await frames(10_048, 1024)
        took = time.perf_counter() - t0
        torch.cuda.synchronize()
        after = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        pinned_after = (pipeline.pool.allocations, dec.staging.allocations)
    print(
        f"10,048 frames in {took:.1f} s ({10_048 / took:.0f}/s): device allocated/reserved "
        f"{before} -> {after} bytes; pinned pool and staging allocations {pinned_before} -> "
        f"{pinned_after}"
    )
    # Flat: no more device memory in use or reserved after 10,000 frames than after the
    # first 1,024 (what is in use at the first reading may still include a batch in flight).
    assert after[1] <= before[1] + (8 << 20)
    assert after[0] <= before[0] + (1 << 20)
    assert pinned_after == pinned_before
