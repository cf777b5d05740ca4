"""Batched decode: which frames go to the device decoder, fallbacks, one bad frame in a batch.

The host implementation is the real one (the pipeline's decode + letterbox). The device
decoder's control flow (routing, the batch that fails whole and is retried frame by
frame, the host fallback, the device letterbox) runs on torch's CPU device with a
stand-in for nvJPEG (tests named ``mock``): CI has no GPU. tests/gpu/test_decode_gpu.py
runs the same code with nvJPEG on a GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import struct
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from edge_vision.common.messages import FrameMessage
from edge_vision.common.metrics import Metrics
from edge_vision.engines.device_frame import DeviceFrame, wait_ready
from edge_vision.errors import ClientError
from edge_vision.frames.decode_batch import (
    BatchDecoder,
    DecodeBatcher,
    DecodeRequest,
    Prepared,
    device_decodable,
    jpeg_kind,
)
from edge_vision.frames.decode_gpu import CudaBatchDecoder
from edge_vision.frames.infer import InferenceService
from edge_vision.frames.pipeline import FramePipeline
from edge_vision.model.shape import letterbox_into
from edge_vision.model.spec import ModelSpec

from ..support.images import blank_scene, text_scene
from ..support.server import make_config

pytestmark = pytest.mark.timeout(60)


def _progressive(rgb: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    return buf.tobytes()


def _pillow_jpeg(mode: str, size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 90).save(buf, format="JPEG")
    return buf.getvalue()


def _with_adobe_transform(data: bytes, transform: int) -> bytes:
    """The JPEG with an APP14 'Adobe' segment (version 100, flags 0, transform) after SOI."""
    body = b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform)
    return data[:2] + b"\xff\xee" + struct.pack(">H", len(body) + 2) + body + data[2:]


def _sof_precision(data: bytes, bits: int) -> bytes:
    i = data.index(b"\xff\xc0")
    return data[: i + 4] + bytes([bits]) + data[i + 5 :]


@pytest.fixture
def pipeline(spec: ModelSpec) -> FramePipeline:
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    return FramePipeline(cfg, InferenceService(spec, cfg))


def _request(pipeline: FramePipeline, data: bytes) -> DecodeRequest:
    return pipeline.request_for(FrameMessage(1, 0.0, data, False, 0.0))


def _batcher(pipeline: FramePipeline, device: BatchDecoder, **options: Any) -> DecodeBatcher:
    """A batcher over the pipeline's host decoder and worker pool with ``device`` as its
    GPU decoder, at most 64 frames a call unless ``max_batch`` says otherwise."""
    options.setdefault("max_batch", 64)
    return DecodeBatcher(pipeline.host_decoder, device, pipeline.executor, **options)


class _StandInNvjpeg(CudaBatchDecoder):
    """The device decoder on torch's CPU device; libjpeg-turbo stands in for nvJPEG and,
    like nvJPEG's batched call, fails the whole call when one image in it is bad."""

    def _nvjpeg(self, datas: list[Any]) -> list[Any]:
        torch = self._torch
        out = []
        for d in datas:
            try:
                rgb = simplejpeg.decode_jpeg(d.numpy().tobytes(), colorspace="RGB")
            except ValueError as e:
                raise RuntimeError(f"nvjpegDecodeBatched failed: {e}") from None
            out.append(torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1))
        return out


def _stand_in(pipeline: FramePipeline) -> _StandInNvjpeg:
    pytest.importorskip("torch", reason="the device decoder's control flow runs on torch")
    return _StandInNvjpeg(pipeline.host_decoder, device="cpu")


@pytest.fixture
def metrics() -> Metrics:
    """Made before an async test's loop runs: its collectors look at files."""
    return Metrics()


@pytest.fixture
def stand_in(pipeline: FramePipeline) -> _StandInNvjpeg:
    """:func:`_stand_in` made before an async test's loop runs: torch's first use reads
    files, which the event loop must not (blockbuster)."""
    return _stand_in(pipeline)


def test_routing_sends_baseline_colour_and_grey_jpegs_to_the_device_the_rest_to_the_host(
    pipeline: FramePipeline,
) -> None:
    rgb = blank_scene(320, 200).rgb
    baseline = simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), colorspace="RGB")
    device = {
        "baseline YCbCr": baseline,
        "grey": _pillow_jpeg("L"),
        "Adobe YCbCr (transform 1)": _with_adobe_transform(baseline, 1),
    }
    host = {
        "PNG": blank_scene(320, 200).png(),
        "progressive": _progressive(rgb),
        "CMYK": _pillow_jpeg("CMYK"),
        "Adobe RGB (transform 0)": _with_adobe_transform(baseline, 0),
        "12-bit": _sof_precision(baseline, 12),
    }
    for name, data in device.items():
        assert device_decodable(_request(pipeline, data)), name
    for name, data in host.items():
        assert not device_decodable(_request(pipeline, data)), name
    kind = jpeg_kind(_progressive(rgb))
    assert kind is not None and kind.sof == 0xC2 and kind.precision == 8
    assert jpeg_kind(b"\xff\xd8\xff\xe0\x00") is None  # cut before its frame header


@pytest.mark.parametrize(
    ("fit", "shape"),
    # The default model stretches 640x360 to fill 640x352 (a resize); a letterbox pads it
    # into 640x384 (no resize, only padding).
    [("stretch", (352, 640, 3)), ("letterbox", (384, 640, 3))],
)
def test_mock_device_decoder_one_corrupt_jpeg_in_a_batch_fails_only_its_own_frame(
    spec: ModelSpec, fit: str, shape: tuple[int, int, int]
) -> None:
    fitted = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, fit=fit))
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    pipeline = FramePipeline(cfg, InferenceService(fitted, cfg))
    dec = _stand_in(pipeline)
    scenes = [text_scene(640, 360, seed=s) for s in range(3)]
    good = [s.jpeg() for s in scenes]
    # A header that reads fine, then entropy-coded data cut off: routed to the device,
    # refused there, refused on the host too.
    corrupt = good[1][: len(good[1]) // 3]
    requests = [_request(pipeline, d) for d in (good[0], corrupt, good[1], good[2])]
    assert all(device_decodable(r) for r in requests)

    out = dec.decode_batch(requests)

    assert isinstance(out[1], ClientError) and out[1].code == "bad_image"
    assert dec.batch_failures == 1  # the batched call failed whole, then frame by frame
    for got, data in zip((out[0], out[2], out[3]), good, strict=True):
        assert isinstance(got, Prepared) and got.on_device
        host = pipeline.host_decoder.decode_one(_request(pipeline, data))
        canvas = got.canvas.host()
        assert canvas.shape == host.canvas.shape == shape
        # Same pixels, placed the same way.
        assert np.abs(canvas.astype(int) - host.canvas.astype(int)).mean() < 2
        assert got.letterbox == host.letterbox
    assert (dec.device_frames, dec.host_frames) == (3, 1)


class _RefusingNvjpeg(_StandInNvjpeg):
    """A GPU decoder that cannot decode anything here (as a decoder nvImageCodec could
    not create): every call fails."""

    def _nvjpeg(self, datas: list[Any]) -> list[Any]:
        raise RuntimeError("Could not create decoder. Code: 7")


def test_mock_a_device_decoder_that_refuses_every_frame_says_so_once_and_counts_the_rest(
    spec: ModelSpec, caplog: pytest.LogCaptureFixture
) -> None:
    # Its frames are still answered (by the host decoder), but a route that sends every
    # frame the host way must not look like a GPU route in the logs.
    pytest.importorskip("torch", reason="the device decoder's control flow runs on torch")
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    pipeline = FramePipeline(cfg, InferenceService(spec, cfg))
    dec = _RefusingNvjpeg(pipeline.host_decoder, device="cpu")
    good = [text_scene(320, 180, seed=s).jpeg() for s in range(3)]
    with caplog.at_level(logging.WARNING, logger="edge_vision.frames.decode_gpu"):
        for _ in range(2):
            out = dec.decode_batch([_request(pipeline, d) for d in good])
            assert all(isinstance(o, Prepared) and not o.on_device for o in out)
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and "Could not create decoder" in said[0], said
    assert dec.refusals == 2 and (dec.device_frames, dec.host_frames) == (0, 6)


@pytest.mark.parametrize(
    ("fit", "apart"),
    # letterbox: 1280x720 -> 640x360 inside 640x384, the host's DCT 1/2 downscale is the
    # whole resize. stretch (the default model's): 640x352, so after the DCT halving the
    # host resamples 360 -> 352 rows once more (INTER_LINEAR) where the device does one
    # area resize: measured 2.50 grey levels apart on average, each 2.2-2.3 from the
    # full-resolution area resize.
    [("letterbox", 2.0), ("stretch", 3.0)],
)
def test_mock_device_decoder_sends_png_and_progressive_frames_the_host_way(
    spec: ModelSpec, fit: str, apart: float
) -> None:
    fitted = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, fit=fit))
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    pipeline = FramePipeline(cfg, InferenceService(fitted, cfg))
    dec = _stand_in(pipeline)
    scene = text_scene(1280, 720)
    frames = [scene.png(), _progressive(scene.rgb), scene.jpeg()]
    out = dec.decode_batch([_request(pipeline, d) for d in frames])
    assert all(isinstance(o, Prepared) for o in out)
    assert [o.on_device for o in out if isinstance(o, Prepared)] == [False, False, True]
    assert dec.batch_failures == 0 and (dec.device_frames, dec.host_frames) == (1, 2)
    # The device letterbox (area resize from 1280x720) against the host's (DCT 1/2
    # downscale inside libjpeg) of the same JPEG, and each against an area resize of the
    # full-resolution decode into the same place.
    host = pipeline.host_decoder.decode_one(_request(pipeline, frames[2]))
    device = out[2]
    assert isinstance(device, Prepared) and device.letterbox == host.letterbox
    lb = host.letterbox
    full = np.zeros_like(host.canvas)
    region = full[lb.pad_y : lb.pad_y + lb.new_h, lb.pad_x : lb.pad_x + lb.new_w]
    decoded = cv2.imdecode(np.frombuffer(frames[2], np.uint8), cv2.IMREAD_COLOR)
    region[:] = cv2.resize(decoded, (lb.new_w, lb.new_h), interpolation=cv2.INTER_AREA)
    dev = device.canvas.host().astype(int)
    diff = np.abs(dev - host.canvas.astype(int))
    print(f"device vs host {fit}: mean {diff.mean():.2f}, max {diff.max()}")
    assert diff.mean() < apart
    for got in (dev, host.canvas.astype(int)):
        assert np.abs(got - full.astype(int)).mean() < 2.5


async def test_mock_decode_batcher_batches_waiting_device_frames_and_keeps_host_frames_apart(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    dec = stand_in
    batcher = _batcher(pipeline, dec, in_flight=1)
    jpegs = [text_scene(320, 180, seed=s).jpeg() for s in range(9)]
    requests = [_request(pipeline, d) for d in jpegs]
    corrupt = _request(pipeline, jpegs[0][:200])
    results = await asyncio.gather(
        *(batcher.decode(r) for r in requests),
        batcher.decode(corrupt),
        *(batcher.decode(r, device=False) for r in requests[:3]),
        return_exceptions=True,
    )
    # The first frame found the device idle and went alone; the others waited for it and
    # went in one call, the corrupt one among them.
    assert (batcher.batches, batcher.batched_frames) == (2, 10)
    assert all(isinstance(r, Prepared) and r.on_device for r in results[:9])
    assert isinstance(results[9], ClientError) and results[9].code == "bad_image"
    assert all(isinstance(r, Prepared) and not r.on_device for r in results[10:])
    await pipeline.close()


async def test_mock_decode_window_gathers_frames_into_one_call_and_a_full_batch_goes_at_once(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    """decode.device_window_ms: the first frame waits for the others instead of going
    alone, a lone frame goes after its window (never before), and max_batch frames go at
    once however long the window."""
    dec = stand_in
    loop = asyncio.get_running_loop()
    jpegs = [text_scene(320, 180, seed=s).jpeg() for s in range(6)]
    requests = [_request(pipeline, d) for d in jpegs]

    gathered = _batcher(pipeline, dec, in_flight=1, window_s=0.2)
    first = asyncio.ensure_future(gathered.decode(requests[0]))
    await asyncio.sleep(0.01)  # arrives inside the first frame's window
    rest = await asyncio.gather(*(gathered.decode(r) for r in requests[1:]))
    assert all(isinstance(r, Prepared) and r.on_device for r in [await first, *rest])
    assert (gathered.batches, gathered.batched_frames) == (1, 6)  # window 0: 2 calls

    t0 = loop.time()
    alone = await gathered.decode(requests[0])
    assert alone.on_device and loop.time() - t0 >= 0.2
    assert (gathered.batches, gathered.batched_frames) == (2, 7)

    full = _batcher(pipeline, dec, max_batch=3, in_flight=1, window_s=60.0)
    done = await asyncio.wait_for(asyncio.gather(*(full.decode(r) for r in requests[:3])), 30)
    assert len(done) == 3 and (full.batches, full.batched_frames) == (1, 3)
    await gathered.drain()
    await full.drain()
    await pipeline.close()
    # The setting reaches the pipeline's batcher.
    cfg = make_config({"engine": {"kind": "onnxruntime"}, "decode": {"device_window_ms": 12}})
    configured = FramePipeline(cfg, InferenceService(pipeline.service.spec, cfg))
    assert configured.decoding.window_s == pytest.approx(0.012)
    await configured.close()


async def test_mock_adaptive_window_gathers_close_frames_and_never_holds_frames_further_apart(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    """decode.device_window_adaptive: frames arriving closer together than the window are
    gathered into one call as with the plain window; frames arriving further apart than
    the window (one camera, a light load) go at once instead of each waiting out a window
    for a call that carries it alone. The setting reaches the pipeline, on by default."""
    loop = asyncio.get_running_loop()
    requests = [_request(pipeline, text_scene(320, 180, seed=s).jpeg()) for s in range(12)]

    def batcher() -> DecodeBatcher:
        return _batcher(pipeline, stand_in, in_flight=1, window_s=0.4, adaptive=True)

    close = batcher()
    pending = []
    for r in requests:  # 12 frames 10 ms apart
        pending.append(asyncio.ensure_future(close.decode(r)))
        await asyncio.sleep(0.01)
    got = await asyncio.gather(*pending)
    assert all(isinstance(g, Prepared) and g.on_device for g in got)
    # The first went at once, alone (no gap known yet); the other 11 came inside the
    # second one's window and went in one call (window 0: about a call a frame).
    assert (close.batches, close.batched_frames) == (2, 12)

    apart = batcher()
    waits = []
    for r in requests[:3]:  # 0.9 s apart: further than the window
        t0 = loop.time()
        assert (await apart.decode(r)).on_device
        waits.append(loop.time() - t0)
        await asyncio.sleep(0.9)
    assert (apart.batches, apart.batched_frames) == (3, 3)
    # Each went at once; the plain window would hold each for 0.4 s.
    assert max(waits) < 0.3, waits
    await close.drain()
    await apart.drain()
    await pipeline.close()
    cfg = make_config({"engine": {"kind": "onnxruntime"}, "decode": {"device_window_ms": 12}})
    configured = FramePipeline(cfg, InferenceService(pipeline.service.spec, cfg))
    assert configured.decoding.adaptive is True
    await configured.close()


async def test_mock_adaptive_window_with_min_frames_waits_only_for_a_busy_worker(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    """decode.device_window_min_frames: frames 0.1 s apart would fill a 0.4 s window with
    about four. Asked for two a window, the calls wait and gather them; asked for six,
    this worker is not busy enough to be worth a wait, so every frame goes at once, as
    at window 0. The setting reaches the pipeline."""
    loop = asyncio.get_running_loop()
    requests = [_request(pipeline, text_scene(320, 180, seed=s).jpeg()) for s in range(10)]

    async def send(min_frames: float) -> tuple[DecodeBatcher, list[float]]:
        b = _batcher(
            pipeline,
            stand_in,
            in_flight=len(requests),  # only a window can put two frames in one call
            window_s=0.4,
            adaptive=True,
            min_frames=min_frames,
        )
        waits: list[float] = []
        pending = []
        for r in requests:  # 10 frames 0.1 s apart
            fut = asyncio.ensure_future(b.decode(r))
            t0 = loop.time()
            fut.add_done_callback(lambda _, t0=t0: waits.append(loop.time() - t0))
            pending.append(fut)
            await asyncio.sleep(0.1)
        assert all(p.on_device for p in await asyncio.gather(*pending))
        await b.drain()
        return b, waits

    gathering, _ = await send(2)
    busy_only, waits = await send(6)
    # Two a window expected: after the first lone frame, calls held frames for the window.
    assert gathering.batches <= 5, gathering.batches
    # Six a window expected, four come: no call waited, each frame went alone at once.
    assert (busy_only.batches, busy_only.batched_frames) == (10, 10)
    assert max(waits) < 0.3, waits  # a held frame would wait 0.4 s
    await pipeline.close()
    cfg = make_config(
        {
            "engine": {"kind": "onnxruntime"},
            "decode": {"device_window_ms": 12, "device_window_min_frames": 5},
        }
    )
    configured = FramePipeline(cfg, InferenceService(pipeline.service.spec, cfg))
    assert configured.decoding.min_frames == 5
    await configured.close()


async def test_mock_adaptive_window_is_not_started_by_a_few_frames_read_back_to_back(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    """A worker whose frames come about 3.6 a window, asked for 5 (min_frames), does not
    wait; nor when six frames then arrive at once, as they do after the event loop was
    busy for a moment: the average over the last 32 gaps barely moves (the 1/8 exponential
    average of commit 26e6ad7, or a mean of the last 8 gaps, would fall under the
    threshold and hold the burst for the window; the exponential one held such frames at
    32 cameras on the H200)."""
    loop = asyncio.get_running_loop()
    scenes = [text_scene(320, 180, seed=s).jpeg() for s in range(4)]
    b = _batcher(
        pipeline,
        stand_in,
        in_flight=8,  # only a window can put two frames in one call
        window_s=0.1,
        adaptive=True,
        min_frames=5,  # waits while the average gap is 20 ms or less
    )
    start = loop.time()
    steady = []
    for i in range(33):  # 32 gaps of 28 ms (or a little more): about 3.6 frames a window
        await asyncio.sleep(max(0.0, start + i * 0.028 - loop.time()))
        steady.append(asyncio.ensure_future(b.decode(_request(pipeline, scenes[i % 4]))))
    assert all(g.on_device for g in await asyncio.gather(*steady))
    assert b.batches >= 25, b.batches  # (held for windows, about 9 calls)
    await asyncio.sleep(0.028)
    before = b.batches
    burst = [_request(pipeline, scenes[i % 4]) for i in range(6)]
    got = await asyncio.gather(*(b.decode(r) for r in burst))
    assert all(g.on_device for g in got)
    # Each went at once, in a call of its own; under a shorter average the last three or
    # four would have been held for the window and gone in one call (4 calls, not 6).
    assert b.batches - before == 6
    await b.drain()
    await pipeline.close()


async def test_mock_a_frame_that_waited_for_a_busy_stream_is_not_held_for_a_second_window(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window counts from a frame's arrival: a frame that waited out its window behind
    a busy device call goes as soon as that call ends, not a window later."""
    slow = stand_in
    decode_batch = slow.decode_batch

    def one_second_call(requests: Any) -> Any:
        time.sleep(1.0)  # a device thread's call; the loop stays free
        return decode_batch(requests)

    monkeypatch.setattr(slow, "decode_batch", one_second_call)
    batcher = _batcher(pipeline, slow, in_flight=1, window_s=0.5)
    loop = asyncio.get_running_loop()
    a_req, b_req = (_request(pipeline, text_scene(320, 180, seed=s).jpeg()) for s in (1, 2))
    t0 = loop.time()
    a = asyncio.ensure_future(batcher.decode(a_req))  # goes at 0.5 s, busy until 1.5 s
    await asyncio.sleep(0.6)
    b = await batcher.decode(b_req)  # waited 0.9 s by 1.5 s: goes then, done at 2.5 s
    b_done = loop.time() - t0
    assert isinstance(await a, Prepared) and isinstance(b, Prepared)
    assert (batcher.batches, batcher.batched_frames) == (2, 2)
    # Held for a window from the stream's release instead, it would end at 3.0 s.
    assert 2.4 <= b_done < 2.9, b_done
    await batcher.drain()
    await pipeline.close()


async def test_mock_closing_sends_a_frame_still_inside_its_decode_window_and_counts_the_call(
    spec: ModelSpec, stand_in: _StandInNvjpeg, metrics: Metrics
) -> None:
    """A frame waiting out a long window when the pipeline closes is decoded and answered,
    not left waiting for a timer that closing cancelled; the call shows in
    edge_vision_decode_batch_size."""
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    pipe = FramePipeline(cfg, InferenceService(spec, cfg, metrics=metrics))
    pipe.decoding.device = stand_in  # what a CUDA engine's start sets (_engine_changed)
    pipe.decoding.window_s = 60.0  # far longer than the test
    pipe.decoding.adaptive = False  # a lone frame waits out the whole window
    waiting = asyncio.ensure_future(
        pipe.decoding.decode(_request(pipe, blank_scene(320, 180).jpeg()))
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()  # inside its window
    await asyncio.wait_for(pipe.decoding.drain(), 30)
    got = await asyncio.wait_for(waiting, 5)
    assert isinstance(got, Prepared) and got.on_device
    text = metrics.render().decode()
    assert "edge_vision_decode_batch_size_count 1.0" in text
    assert "edge_vision_decode_batch_size_sum 1.0" in text
    await pipe.close()


async def test_mock_closing_sends_frames_an_adaptive_window_holds(
    pipeline: FramePipeline, stand_in: _StandInNvjpeg
) -> None:
    """Frames that an adaptive window holds (they came 10 ms apart against a 60 s window)
    are decoded and answered when the batcher drains, in one call, not left waiting."""
    batcher = _batcher(pipeline, stand_in, in_flight=1, window_s=60.0, adaptive=True)
    requests = [_request(pipeline, text_scene(320, 180, seed=s).jpeg()) for s in range(3)]
    first = await batcher.decode(requests[0])  # no gap known yet: at once
    held = []
    for r in requests[1:]:
        held.append(asyncio.ensure_future(batcher.decode(r)))
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert not any(h.done() for h in held)  # inside the window, worth waiting for
    await asyncio.wait_for(batcher.drain(), 30)
    got = await asyncio.wait_for(asyncio.gather(*held), 5)
    assert first.on_device and all(g.on_device for g in got)
    assert (batcher.batches, batcher.batched_frames) == (2, 3)
    await pipeline.close()


async def test_service_end_to_end_through_the_host_batch_decoder(spec: ModelSpec) -> None:
    """The pipeline's one decode entry (DecodeBatcher) with the host implementation:
    text found, a corrupt JPEG refused alone, decode time reported."""
    cfg = make_config({"engine": {"kind": "onnxruntime"}, "decode": {"device": "auto"}})
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    from edge_vision.frames.pipeline import FrameSettings

    try:
        assert pipeline.decoding.device is None  # ONNX Runtime reads host memory only
        scene = text_scene(1280, 720, texts=[("PART 77-A", (300, 260))])
        good = FrameMessage(1, 0.0, scene.jpeg(), False, 0.0)
        bad = FrameMessage(2, 0.0, scene.jpeg()[:3000], False, 0.0)
        results = await asyncio.gather(
            pipeline.process(good, FrameSettings(0.5)),
            pipeline.process(bad, FrameSettings(0.5)),
            return_exceptions=True,
        )
    finally:
        await pipeline.close()
        await service.close()
    res, err = results
    assert isinstance(err, ClientError) and err.code == "bad_image"
    assert not isinstance(res, BaseException)
    assert len(res.detections) == 1 and res.timing["decode_ms"] > 0
    x1, y1, x2, y2 = res.detections[0][:4]
    assert x1 < 320 < x2 and y1 < 290 < y2


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080), (1000, 700)])
def test_mock_device_letterbox_of_a_fractional_shrink_equals_the_host_letterbox(
    pipeline: FramePipeline, size: tuple[int, int]
) -> None:
    """1280x720 stretched to 640x352 shrinks its height by 2.045: the device letterbox
    must weigh partly covered rows as cv2's INTER_AREA does (torch's own ``area`` mode
    was 2.1 grey levels off on average, 37 at most, on text edges), so the engine sees
    the frame the host path would give it, whichever decoder made it."""
    dec = _stand_in(pipeline)
    torch = dec._torch
    w, h = size
    scene = text_scene(w, h, seed=5)
    req = _request(pipeline, scene.jpeg())
    lb = req.letterbox
    assert w % lb.new_w or h % lb.new_h  # a shrink by a fraction on at least one axis
    rgb = simplejpeg.decode_jpeg(req.data, colorspace="RGB")
    (canvas,) = dec.letterbox([torch.from_numpy(rgb.copy()).permute(2, 0, 1)], [lb], 114)
    ref = np.empty((lb.out_h, lb.out_w, 3), np.uint8)
    letterbox_into(rgb[:, :, ::-1].copy(), lb, ref, 114)
    diff = np.abs(canvas.numpy().astype(np.int16) - ref)
    assert diff.mean() < 0.05 and diff.max() <= 1


class _MockEvent:
    """Stands in for a torch CUDA event (CI has no GPU): completes when told to."""

    log: ClassVar[list[str]] = []

    def __init__(self, blocking: bool = False) -> None:
        assert blocking, "a host wait on this event must sleep, not spin"
        self.done = False
        self.recorded_on: Any = None

    def record(self, stream: Any) -> None:
        self.recorded_on = stream

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        _MockEvent.log.append("synchronize")
        self.done = True


class _MockStream:
    def __init__(self) -> None:
        self.waited: list[Any] = []

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)


def test_mock_engine_stream_waits_once_for_each_decode_batch_event_and_never_for_host_frames() -> (
    None
):
    torch = pytest.importorskip(
        "torch", reason="torch is not installed here (device frames are torch tensors)"
    )
    first, second = _MockEvent(True), _MockEvent(True)
    canvas = torch.zeros((2, 2, 3), dtype=torch.uint8)
    frames = [
        DeviceFrame(canvas, first),
        np.zeros((2, 2, 3), np.uint8),  # decoded on the host: nothing to wait for
        DeviceFrame(canvas, first),  # the same decode batch: one wait covers both
        DeviceFrame(canvas, None),  # waited for by its decoder already (device_wait host)
        DeviceFrame(canvas, second),
    ]
    stream = _MockStream()
    wait_ready(frames, stream)
    assert stream.waited == [first, second]


def test_mock_a_device_frame_copied_to_the_host_waits_for_its_decode_first() -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is not installed here (device frames are torch tensors)"
    )
    ready = _MockEvent(True)

    class _Canvas:
        def cpu(self) -> Any:
            _MockEvent.log.append("copy")
            return torch.full((2, 2, 3), 7, dtype=torch.uint8)

    _MockEvent.log = []
    got = DeviceFrame(_Canvas(), ready).host()
    assert _MockEvent.log == ["synchronize", "copy"]
    assert got.shape == (2, 2, 3) and int(got.max()) == 7


def test_mock_decoded_images_live_until_the_letterbox_that_reads_them_has_run(
    pipeline: FramePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode.device_wait stream: the decoder returns before its stream has run, so the
    full-size images its queued letterbox reads (nvImageCodec's memory) must outlive the
    canvases' callers; they go once the batch's event has completed, not before, and no
    thread waits for the stream."""
    dec = _stand_in(pipeline)
    dec.wait = "stream"
    waited: list[Any] = []
    monkeypatch.setattr(dec, "_wait", waited.append)
    dec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_MockEvent))
    stream = _MockStream()
    images = [object(), object()]
    ready = dec._ready(stream, images)
    assert isinstance(ready, _MockEvent) and ready.recorded_on is stream
    later_images = [object()]
    later = dec._ready(stream, later_images)
    dec._reap()
    assert [held for _, held in dec._reading] == [images, later_images]
    ready.done = True
    dec._reap()
    assert len(dec._reading) == 1  # the first batch's images went; the second's stay
    later.done = True
    dec._reap()
    assert not dec._reading and not waited


def test_mock_device_wait_host_waits_for_the_stream_and_holds_nothing(
    pipeline: FramePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode.device_wait host (the default): the decode thread waits for its stream,
    the canvases carry no event and the decoder keeps no images."""
    dec = _stand_in(pipeline)
    assert dec.wait == "host"
    waited: list[Any] = []
    monkeypatch.setattr(dec, "_wait", waited.append)
    stream = _MockStream()
    assert dec._ready(stream, [object()]) is None
    assert waited == [stream] and not dec._reading
    (out,) = dec.decode_batch([_request(pipeline, text_scene(320, 180).jpeg())])
    assert isinstance(out, Prepared) and isinstance(out.canvas, DeviceFrame)
    assert out.canvas.ready is None and not dec._reading


class _MockCudaEngine:
    """An engine that takes GPU-decoded frames (a CUDA engine: none can run here)."""

    accepts_device_frames = True

    def host_allocator(self) -> None:
        return None


def test_mock_opencv_runs_one_thread_while_a_cuda_engine_serves(
    spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server.opencv_threads unset: a CUDA engine makes OpenCV run one thread a call,
    whether frames are letterboxed on the GPU (the device decoder) or on the host
    (decode.device host); a fallback to ONNX Runtime gives OpenCV its pool back. A mock
    CUDA engine and device decoder: no GPU here."""
    default = cv2.getNumThreads()
    try:
        for where in ("cuda", "host"):
            cfg = make_config({"engine": {"kind": "onnxruntime"}, "decode": {"device": where}})
            pipeline = FramePipeline(cfg, InferenceService(spec, cfg))
            device = types.SimpleNamespace(
                device="cuda:0", library="nvimgcodec", set_staging_allocator=lambda _a: None
            )
            monkeypatch.setattr(
                "edge_vision.frames.pipeline.make_device_decoder",
                lambda d, *_a, _dev=device, **_k: _dev if d == "cuda" else None,
            )
            pipeline._engine_changed(_MockCudaEngine())  # type: ignore[arg-type]
            assert (pipeline.decoding.device is device) == (where == "cuda")
            assert cv2.getNumThreads() == 1, where
            cpu = types.SimpleNamespace(accepts_device_frames=False, host_allocator=lambda: None)
            pipeline._engine_changed(cpu)  # type: ignore[arg-type]
            assert cv2.getNumThreads() == default, where
    finally:
        cv2.setNumThreads(-1)


def test_device_decode_bench_times_the_letterbox_a_frame_on_torch_s_cpu_device(
    tmp_path: Path,
) -> None:
    """``python -m benchmarks.device_decode`` without a GPU: the letterbox stage at
    each batch size asked for, per frame, with the driver's and the other threads' CPU; the
    GPU stages (decode, decode_batch) only where there is a GPU to time them on."""
    pytest.importorskip("torch", reason="the device letterbox runs on torch")
    from benchmarks.device_decode import main

    out = tmp_path / "dd.json"
    main(["--batches", "1", "2", "--seconds", "0.05", "--device", "cpu", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["gpu"] is None
    (rows,) = result["runs"].values()
    assert sorted(rows) == ["1", "2"]
    assert list(result["refused"]) == list(result["runs"])  # said for each run
    with pytest.raises(SystemExit):  # a backend nvImageCodec has not: one line, no traceback
        main(["--backends", "hw+gpu", "--device", "cpu"])
    for row in rows.values():
        assert list(row) == ["letterbox"]
        assert row["letterbox"]["wall_ms"] > 0 and row["letterbox"]["driver_cpu_ms"] > 0
