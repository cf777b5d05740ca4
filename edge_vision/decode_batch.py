"""Batched decode: encoded frames → letterboxed engine-input canvases, on the host or the GPU.

One interface, :meth:`BatchDecoder.decode_batch`: a list of :class:`DecodeRequest`
(bytes whose header was already read and whose pixel limit was already checked on the
host, plus the frame's :class:`~edge_vision.shape.Letterbox`) → for each frame either a
:class:`Prepared` canvas or the :class:`~edge_vision.errors.ClientError` that frame earned.
One bad frame never fails the others.

* :class:`HostBatchDecoder`: frame by frame through the pipeline's one host path
  (:meth:`edge_vision.pipeline.FramePipeline.decode_request`: decode.py's decoder —
  libjpeg-turbo through simplejpeg, with DCT-domain downscaling — and
  :func:`~edge_vision.shape.letterbox_into` into :class:`~edge_vision.decode.BufferPool`
  canvases, under the memory budget). It serves the service without a GPU, CI, and every
  frame the device decoder does not take.
* :class:`CudaBatchDecoder`: a list of frames decoded on the GPU by nvImageCodec
  (:class:`NvImgCodecJpeg`: the GPU's hardware JPEG engine, then its CUDA decoder; chosen
  by ``decode.device_library``) or by nvJPEG through
  ``torchvision.io.decode_jpeg(device="cuda")``, whose Huffman stage runs on the host;
  then letterbox (area resize when shrinking, bilinear when
  enlarging, as :func:`~edge_vision.shape.letterbox_into` picks) on the device into
  uint8 BGR canvases that the CUDA engines stack or copy into their input batch;
  normalisation runs inside the engine as before.

Routing (:func:`device_decodable`): baseline or extended-sequential 8-bit JPEGs with one
(grey) or three (YCbCr) components go to the device; PNG, progressive, 12-bit, CMYK/YCCK
and Adobe-RGB JPEGs go the host way frame by frame. A batched GPU decode call that fails as
a whole is retried frame by frame; a frame the GPU decoder still refuses is decoded on the
host, which raises ``bad_image`` for a corrupt one, so only that frame fails.

:class:`DecodeBatcher` feeds either from the event loop: frames for the device are
batched (everything waiting when a device stream frees up, at most ``decode.device_batch``
frames), frames for the host are decoded one per worker-pool job, as before.

For torchvision's nvJPEG, compressed bytes are staged in a pool of their own
(``staging``: pinned host memory from the CUDA layer when a CUDA engine is active);
nvImageCodec reads them where they are.

Stream ordering: the GPU decode and the letterbox run on the decoder's own CUDA stream.
With ``decode.device_wait`` host (the default), :meth:`CudaBatchDecoder.decode_batch`
returns once its stream has finished (the wait blocks the worker thread, not the event
loop). With ``stream`` it returns once that work is queued: each canvas is a
:class:`DeviceFrame` carrying an event recorded after it, and the engine's stream waits
for that event on the GPU before it reads the canvas (:func:`wait_ready`), so the
decoder's thread does not wait for its letterbox (torchvision's nvJPEG still waits for
the stream before each decode: see :meth:`CudaBatchDecoder.decode_pixels`). A canvas's
memory goes back to torch's caching allocator only when the last reference goes, and to
the decoder's stream, whose later work runs after the work that wrote it; the engine slot
holds a reference until its batch's event has completed
(:class:`~edge_vision.engines.gpu_base.GpuEngine`), so no decode can write into memory an
engine stream still has queued work on, even when the frame's caller is gone. The decoded
full-size images, whose memory is nvImageCodec's, are held by the decoder until the
letterbox that reads them has run. tests/gpu/test_decode_gpu.py checks that under
concurrent load.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import importlib
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import cv2
import numpy as np
import numpy.typing as npt

from .decode import Allocator, BufferPool, ImageHeader, numpy_allocator
from .errors import ClientError, ConfigError
from .shape import Letterbox, area_taps
from .threads import role_pool

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True)
class DecodeRequest:
    """One frame to decode: header read and pixel limit checked on the host already."""

    data: bytes
    header: ImageHeader
    letterbox: Letterbox
    started: float = field(default_factory=time.perf_counter)  # decode_ms counts from here


@dataclass(slots=True)
class Prepared:
    """A letterboxed ``out_h × out_w × 3`` uint8 BGR canvas: a pooled host array, or a
    :class:`DeviceFrame` (``on_device``) that stays alive until the engine has read it."""

    canvas: Any  # U8Array from the BufferPool, or a DeviceFrame
    letterbox: Letterbox
    decode_s: float
    shape_s: float
    on_device: bool = False


Outcome = Prepared | ClientError


@dataclass(slots=True, eq=False)
class DeviceFrame:
    """A letterboxed canvas on the GPU and when it is complete.

    ``tensor``: the ``out_h × out_w × 3`` uint8 BGR torch CUDA tensor. ``ready``: a CUDA
    event recorded on the decoder's stream after the decode and letterbox that write it
    (None: complete already, ``decode.device_wait`` host). An engine's stream waits for it
    on the GPU (:func:`wait_ready`) before reading, so with ``stream`` the decoder's
    thread need not wait for the GPU; the engine holds the frame until its own batch,
    which waited for ``ready``, is done (:class:`~.engines.gpu_base.GpuSlot`).
    """

    tensor: Any
    ready: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def nbytes(self) -> int:
        return int(self.tensor.numel())

    def data_ptr(self) -> int:
        return int(self.tensor.data_ptr())

    def host(self) -> U8Array:
        """A host copy, once the canvas is complete (for an engine that cannot read device
        memory, and for tests)."""
        if self.ready is not None:
            self.ready.synchronize()  # a blocking-sync event: this thread sleeps
        out: U8Array = self.tensor.cpu().numpy()
        return out


def wait_ready(frames: Sequence[Any], stream: Any) -> None:
    """Make the torch CUDA ``stream`` wait, on the GPU, until every :class:`DeviceFrame`
    among ``frames`` is complete (each distinct event once; host arrays are skipped)."""
    seen: set[int] = set()
    for f in frames:
        ready = f.ready if isinstance(f, DeviceFrame) else None
        if ready is not None and id(ready) not in seen:
            seen.add(id(ready))
            stream.wait_event(ready)


class BatchDecoder(Protocol):
    """A device decoder behind :class:`DecodeBatcher` (:class:`CudaBatchDecoder`)."""

    name: str

    def takes(self, request: DecodeRequest) -> bool:
        """True when this decoder wants the frame in a batch; False: the host path."""
        ...

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        """Each request's canvas or its ClientError, in order (worker thread)."""
        ...

    def set_staging_allocator(self, allocator: Allocator) -> None:
        """Back the compressed-bytes pool with ``allocator`` (pinned with a CUDA engine)."""
        ...


# ---------------------------------------------------------------------------------------
# Routing

# SOF0 baseline and SOF1 extended sequential (Huffman): what nvJPEG decodes on the GPU.
_DEVICE_SOF = frozenset((0xC0, 0xC1))
_ANY_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True, slots=True)
class JpegKind:
    sof: int  # the SOF marker (0xC0 baseline, 0xC2 progressive, ...)
    precision: int  # bits per sample
    components: int
    adobe_transform: int | None  # APP14 "Adobe" colour transform, when present

    @property
    def device_ok(self) -> bool:
        if self.sof not in _DEVICE_SOF or self.precision != 8:
            return False
        if self.components == 1:
            return True
        # Three components are YCbCr unless an Adobe marker says RGB (transform 0).
        return self.components == 3 and self.adobe_transform != 0


def jpeg_kind(data: bytes) -> JpegKind | None:
    """SOF type, precision, components and the Adobe transform, from the markers before
    the first scan; None when they cannot be read (the host decoder then says why)."""
    i, n = 2, len(data)
    adobe: int | None = None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            i += 2
            continue
        (length,) = struct.unpack_from(">H", data, i + 2)
        if length < 2:
            return None
        if marker == 0xEE and length >= 14 and data[i + 4 : i + 9] == b"Adobe":
            adobe = data[i + 15] if i + 15 < n else None
        elif marker in _ANY_SOF:
            if i + 10 > n:
                return None
            return JpegKind(marker, data[i + 4], data[i + 9], adobe)
        elif marker == 0xDA:
            return None
        i += 2 + length
    return None


def device_decodable(request: DecodeRequest) -> bool:
    """True when the GPU decoder takes this frame (see the module docstring)."""
    if request.header.format != "jpeg":
        return False
    kind = jpeg_kind(request.data)
    return kind is not None and kind.device_ok


# ---------------------------------------------------------------------------------------
# Host


class HostBatchDecoder:
    """Frame by frame through ``prepare_one`` (the pipeline's host decode + letterbox)."""

    name = "host"

    def __init__(self, prepare_one: Callable[[DecodeRequest], Prepared], pad_value: int) -> None:
        self.decode_one = prepare_one
        self.pad_value = pad_value

    def takes(self, request: DecodeRequest) -> bool:
        return False  # every frame is its own worker job, as without batching

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        out: list[Outcome] = []
        for r in requests:
            try:
                out.append(self.decode_one(r))
            except ClientError as e:
                out.append(e)
        return out


# ---------------------------------------------------------------------------------------
# GPU


class NvImgCodecJpeg:
    """nvImageCodec's batched JPEG decode (``nvidia.nvimgcodec``) into ``3 × H × W`` RGB
    torch tensors on the device: the GPU's hardware JPEG engine first (A100, H100, H200,
    Jetson Orin), then nvImageCodec's CUDA decoder for what the engine does not take. Unlike
    torchvision's batched nvJPEG, whose Huffman stage runs on the host, the hardware path
    leaves the host only the header parse. It reads the bytes from host memory itself, so
    no staging copy is needed. One decoder per CUDA stream: calls on different streams may
    run at once from different worker threads.
    """

    def __init__(self, torch: Any, device: Any, cpu_threads: int) -> None:
        try:
            self._nv = importlib.import_module("nvidia.nvimgcodec")
        except ImportError as e:
            raise ConfigError(
                "decode.device_library nvimgcodec needs NVIDIA's nvImageCodec: pip install "
                f"'nvidia-nvimgcodec-cu13[nvjpeg]' (Jetson: nvidia-nvimgcodec-tegra-cu12): {e}"
            ) from e
        self._torch = torch
        self.device = device
        self._cpu_threads = cpu_threads
        nv = self._nv
        self._params = nv.DecodeParams(
            apply_exif_orientation=False,  # as the host decoders and torchvision: raw pixels
            sample_format=nv.SampleFormat.P_RGB,
        )
        self._decoders: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _decoder(self, stream_id: int) -> Any:
        with self._lock:
            dec = self._decoders.get(stream_id)
            if dec is None:
                nv = self._nv
                kinds = (nv.BackendKind.HW_GPU_ONLY, nv.BackendKind.GPU_ONLY)
                backends = [nv.Backend(kind) for kind in kinds]
                dec = nv.Decoder(
                    device_id=self.device.index or 0,
                    max_num_cpu_threads=self._cpu_threads,
                    backends=backends,
                )
                self._decoders[stream_id] = dec
            return dec

    def decode(self, datas: Sequence[bytes], stream: Any) -> list[Any]:
        """Each frame's tensor, or a RuntimeError where nvImageCodec could not decode it."""
        nv, torch = self._nv, self._torch
        handle = int(stream.cuda_stream)
        images = self._decoder(handle).decode(
            [nv.CodeStream(d) for d in datas], params=self._params, cuda_stream=handle
        )
        return [
            torch.as_tensor(img, device=self.device)
            if img is not None
            else RuntimeError("nvImageCodec could not decode this JPEG")
            for img in images
        ]


def import_cuda_torch() -> Any:
    """torch with CUDA, or a ConfigError saying what is missing."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise ConfigError(f"decode.device cuda needs torch with CUDA: {e}") from e
    if not torch.cuda.is_available():
        raise ConfigError("decode.device cuda: CUDA is not available to torch")
    return torch


def import_torchvision_io() -> Any:
    """``torchvision.io`` (nvJPEG), or a ConfigError: needed only without nvImageCodec."""
    try:
        return importlib.import_module("torchvision.io")
    except ImportError as e:
        raise ConfigError(
            "decode.device cuda needs nvImageCodec (decode.device_library) or torchvision "
            f"with CUDA (nvJPEG): {e}"
        ) from e


class _NoStream:
    """Stands in for a CUDA stream when the decoder runs on torch's CPU device (the
    CPU tests of this module's control flow)."""

    def synchronize(self) -> None:
        pass


class CudaBatchDecoder:
    """GPU decode (nvImageCodec, or torchvision's nvJPEG: ``library``) + device letterbox;
    frames it cannot take go to ``host``.

    ``streams``: how many batches may decode at once (one CUDA stream each).
    ``staging``: allocator for the compressed-bytes pool (the CUDA layer's pinned one).
    ``wait`` (``decode.device_wait``): ``host``, the decoder's thread waits for its stream;
    ``stream``, each canvas carries an event the engine's stream waits for on the GPU.
    """

    name = "cuda"

    def __init__(
        self,
        host: HostBatchDecoder,
        *,
        device: str = "cuda:0",
        streams: int = 2,
        staging: Allocator = numpy_allocator,
        library: str = "torchvision",
        cpu_threads: int = 2,
        wait: str = "host",
    ) -> None:
        cuda = device.startswith("cuda")
        self.wait = wait  # decode.device_wait: who waits for the decoder's stream
        # torch's CPU device: only this module's tests, with their own _nvjpeg
        self._torch = import_cuda_torch() if cuda else importlib.import_module("torch")
        self._tvio: Any = None
        torch = self._torch
        self.host = host
        self.device = torch.device(device)
        # decode.device_library: nvImageCodec (hardware JPEG engine) or torchvision's nvJPEG.
        self.nvimgcodec: NvImgCodecJpeg | None = None
        if library != "torchvision":
            try:
                self.nvimgcodec = NvImgCodecJpeg(torch, self.device, cpu_threads)
            except ConfigError as e:
                if library == "nvimgcodec":
                    raise
                log.info("decode.device_library auto: torchvision's nvJPEG (%s)", e)
        if self.nvimgcodec is None and cuda:  # nvJPEG through torchvision instead
            self._tvio = import_torchvision_io()
        self.staging = BufferPool(staging)
        self._streams: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(max(1, streams)):
            self._streams.put(torch.cuda.Stream(self.device) if cuda else _NoStream())
        self._lock = threading.Lock()
        self.device_frames = 0  # frames decoded on the GPU (tests and logs read these)
        self.host_frames = 0
        self.batch_failures = 0  # batched calls that failed whole and were retried
        # (event, decoded images) of batches whose letterbox may still be queued (_ready)
        self._reading: collections.deque[tuple[Any, list[Any]]] = collections.deque()
        if self.nvimgcodec is not None:
            self._warm(self.nvimgcodec, max(1, streams))

    def _warm(self, codec: NvImgCodecJpeg, streams: int) -> None:
        """Each stream's nvImageCodec decoder made and run once now, not on the first
        camera frames: on the H200 the first frames of a 64-camera run waited up to 3.8 s
        for them (docs/benchmarks.md)."""
        tiny = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))[1].tobytes()
        held = [self._streams.get() for _ in range(streams)]
        try:
            for stream in held:
                warmed = codec.decode([tiny], stream)
                self._wait(stream)  # before the decoded image's memory can go
                del warmed
        except Exception as e:  # noqa: BLE001 - a slow first frame, not a failed start
            log.warning("nvImageCodec warm-up failed (%s); its first frames will be slower", e)
        finally:
            for stream in held:
                self._streams.put(stream)

    @property
    def library(self) -> str:
        """The GPU JPEG library in use (``decode.device_library`` once resolved)."""
        return "nvimgcodec" if self.nvimgcodec is not None else "torchvision"

    def set_staging_allocator(self, allocator: Allocator) -> None:
        self.staging.set_allocator(allocator)

    def takes(self, request: DecodeRequest) -> bool:
        return device_decodable(request)

    # -- nvJPEG ---------------------------------------------------------------------

    def _on(self, stream: Any) -> Any:
        """Make ``stream`` torch's current stream (a no-op on the CPU device)."""
        if isinstance(stream, _NoStream):
            return contextlib.nullcontext()
        return self._torch.cuda.stream(stream)

    def _nvjpeg(self, datas: list[Any]) -> list[Any]:
        """torchvision's batched nvJPEG decode of CPU uint8 tensors (RGB out)."""
        tvio = self._tvio
        return list(tvio.decode_jpeg(datas, mode=tvio.ImageReadMode.RGB, device=self.device))

    def decode_pixels(self, requests: Sequence[DecodeRequest], stream: Any) -> list[Any]:
        """The GPU decode: each frame's ``3 × H × W`` RGB tensor, or the exception the
        library raised for it (a batch failing whole is retried frame by frame)."""
        if self.nvimgcodec is not None:
            return self._retry_alone([r.data for r in requests], stream, self.nvimgcodec.decode)
        torch = self._torch
        staged: list[U8Array] = []
        try:
            datas = []
            for r in requests:
                buf = self.staging.acquire((len(r.data),))
                buf[:] = np.frombuffer(r.data, np.uint8)
                staged.append(buf)
                datas.append(torch.from_numpy(buf))
            # torchvision allocates nvJPEG's outputs on this stream but may decode on a
            # stream of its own without waiting for this one: nothing may still be queued
            # here that reads memory the allocator could hand to those outputs.
            self._wait(stream)
            with self._on(stream):
                return self._retry_alone(datas, stream, lambda ds, _s: self._nvjpeg(list(ds)))
        finally:
            # nvJPEG has read the bytes once decode_jpeg returns (it parses them on the
            # host and copies what the device needs before returning).
            for buf in staged:
                self.staging.release(buf)

    def _wait(self, stream: Any) -> None:
        """Block this worker thread until ``stream``'s work is done, asleep: a blocking-sync
        event, where ``Stream.synchronize`` spins a core for the whole wait (on the H200 at
        64 cameras the spinning was a fifth of the server's CPU, py-spy,
        docs/benchmarks.md)."""
        if isinstance(stream, _NoStream):
            stream.synchronize()
            return
        done = self._torch.cuda.Event(blocking=True)
        done.record(stream)
        done.synchronize()

    def _ready(self, stream: Any, images: list[Any]) -> Any:
        """After a batch's letterbox is queued on ``stream``: with ``wait`` stream, an
        event for the engines' streams to wait on; with ``wait`` host, None once this
        thread has waited for the stream.

        The decoded full-size ``images`` are what that queued work reads. nvImageCodec
        owns their memory, and may free it apart from the stream's order when the last
        reference goes, so they are kept here until the event has completed
        (:meth:`_reap`), whoever drops the canvases and when."""
        if self.wait == "host" or isinstance(stream, _NoStream):
            self._wait(stream)
            return None
        ready = self._torch.cuda.Event(blocking=True)  # host() sleeps on it, never spins
        ready.record(stream)
        with self._lock:
            self._reading.append((ready, images))
        return ready

    def _reap(self) -> None:
        """Let go of the decoded images whose letterbox has run (each call, oldest first;
        a stream's events complete in order, and the oldest of all is at the left). What
        is held is bounded: the batches still queued, and once the service goes quiet the
        last batch of each stream, until the next call."""
        with self._lock:
            while self._reading and self._reading[0][0].query():
                self._reading.popleft()

    def _retry_alone(
        self, datas: Sequence[Any], stream: Any, decode: Callable[[Sequence[Any], Any], list[Any]]
    ) -> list[Any]:
        """``decode`` of the whole batch; when that call fails whole (one bad image can do
        that), each frame again on its own, so only the bad one gets its exception."""
        try:
            return decode(datas, stream)
        except Exception:  # noqa: BLE001 - any library error: retried frame by frame
            with self._lock:
                self.batch_failures += 1
        results: list[Any] = []
        for d in datas:
            try:
                results.extend(decode([d], stream))
            except Exception as e:  # noqa: BLE001 - this frame goes the host way
                results.append(e)
        return results

    def letterbox(self, images: Sequence[Any], plans: Sequence[Letterbox], pad: int) -> list[Any]:
        """Device letterbox of ``3 × h × w`` RGB uint8 tensors into ``out_h × out_w × 3``
        BGR uint8 canvases: area resize when shrinking, bilinear when enlarging. Frames
        of one size and plan are resized as one batch, in about a dozen kernels whatever
        the batch (each a launch and a GIL round trip on a busy worker); a canvas with no
        border (the ``preset`` fit of a camera's aspect) is not filled first."""
        torch = self._torch
        f = torch.nn.functional
        canvases: list[Any] = [None] * len(images)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, (img, lb) in enumerate(zip(images, plans, strict=True)):
            groups.setdefault((tuple(img.shape), lb), []).append(i)
        for (shape, lb), idx in groups.items():
            _, h, w = shape
            x = torch.stack([images[i] for i in idx])
            if (h, w) != (lb.new_h, lb.new_w):
                if h >= lb.new_h and w >= lb.new_w:
                    x = area_resize(torch, x.float(), lb.new_h, lb.new_w)
                else:
                    size = (lb.new_h, lb.new_w)
                    x = f.interpolate(x.float(), size=size, mode="bilinear", align_corners=False)
                x = x.round_().clamp_(0, 255).to(torch.uint8)
            dims = (len(idx), lb.out_h, lb.out_w, 3)
            if (lb.new_h, lb.new_w) == (lb.out_h, lb.out_w):
                out = torch.empty(dims, dtype=torch.uint8, device=self.device)
            else:
                out = torch.full(dims, pad, dtype=torch.uint8, device=self.device)
            region = out[:, lb.pad_y : lb.pad_y + lb.new_h, lb.pad_x : lb.pad_x + lb.new_w]
            region.copy_(x.flip(1).permute(0, 2, 3, 1))  # RGB CHW -> BGR HWC
            for j, i in enumerate(idx):
                canvases[i] = out[j]
        return canvases

    # -- the interface --------------------------------------------------------------

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        self._reap()
        out: list[Outcome | None] = [None] * len(requests)
        to_device = [i for i, r in enumerate(requests) if device_decodable(r)]
        to_host = [i for i in range(len(requests)) if i not in set(to_device)]
        if to_device:
            stream = self._streams.get()
            try:
                t0 = time.perf_counter()
                pixels = self.decode_pixels([requests[i] for i in to_device], stream)
                ok, refused = [], []
                for i, p in zip(to_device, pixels, strict=True):
                    (refused.append(i) if isinstance(p, Exception) else ok.append((i, p)))
                if refused:
                    log.debug(
                        "%s refused %d frame(s); decoding them on the host",
                        self.library,
                        len(refused),
                    )
                to_host += refused
                t1 = time.perf_counter()
                plans = [requests[i].letterbox for i, _ in ok]
                images = [p for _, p in ok]
                try:
                    with self._on(stream):
                        canvases = self.letterbox(images, plans, self.host.pad_value)
                except BaseException:
                    self._wait(stream)  # what it queued has run before the images go
                    raise
                ready = self._ready(stream, images)
                t2 = time.perf_counter()
            finally:
                self._streams.put(stream)
            for (i, _), canvas in zip(ok, canvases, strict=True):
                decode_s = t1 - min(t0, requests[i].started)
                frame = DeviceFrame(canvas, ready)
                out[i] = Prepared(frame, requests[i].letterbox, decode_s, t2 - t1, on_device=True)
            with self._lock:
                self.device_frames += len(ok)
        for i in sorted(to_host):
            try:
                out[i] = self.host.decode_one(requests[i])
            except ClientError as e:
                out[i] = e
        with self._lock:
            self.host_frames += len(to_host)
        return [o if o is not None else ClientError("bad_image", "not decoded") for o in out]


def area_resize(torch: Any, x: Any, new_h: int, new_w: int) -> Any:
    """Shrink float ``[N, C, H, W]`` images to ``new_h × new_w`` as cv2's ``INTER_AREA``
    does (:func:`~edge_vision.shape.area_taps`): width, then height, each output a weighted
    sum of the few inputs it covers. Exact for fractional factors too (1280x720 to
    640x352), where torch's ``area`` mode (adaptive average pooling) rounds each window
    to whole pixels. Each axis is three kernels whatever its number of taps: one gather of
    every tap, one product with the weights, one sum. Runs wherever ``x`` is: the device
    letterbox, and CI's CPU tests."""
    for axis, n_out in ((3, new_w), (2, new_h)):
        n_in = x.shape[axis]
        if n_in == n_out:
            continue
        index, weight = _device_taps(torch, n_in, n_out, x.device)
        if x.is_cuda:  # cached, and read by each decoder stream: never freed under one
            stream = torch.cuda.current_stream(x.device)
            index.record_stream(stream)
            weight.record_stream(stream)
        taps = index.shape[1]
        # [..., n_out * taps, ...] -> [..., n_out, taps, ...]: each output's inputs together
        gathered = x.index_select(axis, index.reshape(-1))
        shape = list(x.shape)
        shape[axis : axis + 1] = [n_out, taps]
        w = weight.reshape([n_out, taps] + [1] * (3 - axis))
        x = (gathered.reshape(shape) * w).sum(axis + 1)
    return x


@functools.lru_cache(maxsize=64)
def _device_taps(torch: Any, n_in: int, n_out: int, device: Any) -> tuple[Any, Any]:
    """:func:`~edge_vision.shape.area_taps` on ``device``, made once per size (a copy to
    the device each call would wait for the GPU). Each use records the stream that reads
    them (:func:`area_resize`), so an entry evicted from this cache is not reused by
    torch's allocator while another decoder stream still has kernels queued on it."""
    index, weight = area_taps(n_in, n_out)
    return torch.from_numpy(index).to(device), torch.from_numpy(weight).to(device)


def make_device_decoder(
    device: str,
    host: HostBatchDecoder,
    *,
    streams: int = 2,
    staging: Allocator = numpy_allocator,
    library: str = "auto",
    cpu_threads: int = 2,
    wait: str = "host",
) -> CudaBatchDecoder | None:
    """``decode.device``: ``host`` (None), ``cuda`` or ``auto`` (a decoder when torch sees a
    GPU and nvImageCodec or torchvision is there); ``library``: ``decode.device_library``.

    When the GPU decoder cannot start, this says why and returns None, so frames go the
    host way: it is made inside an engine switch (start, fallback, retry), which must not
    fail half done on it."""
    if device == "host":
        return None
    try:
        return CudaBatchDecoder(
            host,
            streams=streams,
            staging=staging,
            library=library,
            cpu_threads=cpu_threads,
            wait=wait,
        )
    except Exception as e:  # noqa: BLE001 - degrade to host decode, said in the log
        if device == "cuda":
            log.error("decode.device cuda unavailable, decoding on the host: %s", e)
        else:
            log.info("decode.device auto: decoding on the host (%s)", e)
        return None


# ---------------------------------------------------------------------------------------
# From the event loop


class DecodeBatcher:
    """Feeds the host decoder and, when there is one, a device decoder from the event
    loop (see the module docstring).

    Device frames wait while all ``in_flight`` device calls are busy; when one finishes,
    everything waiting (up to ``max_batch``) goes in the next call, so batches grow with
    the load and a lone frame is decoded at once. Host frames are one worker job each in
    the shared pool; device calls run on ``in_flight`` threads of their own.
    """

    def __init__(
        self,
        host: HostBatchDecoder,
        device: BatchDecoder | None,
        executor: Executor,
        *,
        max_batch: int,
        in_flight: int,
        release: Callable[[Prepared], None] | None = None,
    ) -> None:
        self.host = host
        self.device = device
        self.executor = executor
        self.max_batch = max_batch
        self.in_flight = in_flight
        # Gives back the canvas of a frame whose caller went away while it was decoded.
        self._release = release
        self._abandoned: set[concurrent.futures.Future[Prepared]] = set()
        self._abandoned_lock = threading.Lock()
        self._waiting: list[tuple[DecodeRequest, asyncio.Future[Prepared]]] = []
        self._running = 0
        # A device call holds its thread while the GPU works (it waits for its stream):
        # a thread per call in flight of its own, so that post-processing and host decodes
        # in the shared pool never queue behind GPU waits (threads start with the first).
        self._device_threads = role_pool(in_flight, "gpu-decode")
        self.batches = 0  # device calls made (tests and logs read these)
        self.batched_frames = 0

    async def decode(self, request: DecodeRequest, *, device: bool = True) -> Prepared:
        """The frame's canvas; raises its ClientError. ``device`` False (the active
        engine cannot read device memory): the host path."""
        loop = asyncio.get_running_loop()
        if not (device and self.device is not None and self.device.takes(request)):
            job = self.executor.submit(self.host.decode_one, request)
            try:
                return await asyncio.wrap_future(job)
            except asyncio.CancelledError:  # a worker may still be decoding it
                with self._abandoned_lock:
                    self._abandoned.add(job)
                job.add_done_callback(self._release_abandoned)
                raise
        fut: asyncio.Future[Prepared] = loop.create_future()
        self._waiting.append((request, fut))
        self._kick(loop)
        return await fut

    def _release_abandoned(self, job: concurrent.futures.Future[Prepared]) -> None:
        """(Any thread.) The canvas of a decode nobody waits for any more goes back."""
        with self._abandoned_lock:
            self._abandoned.discard(job)
        if not job.cancelled() and job.exception() is None and self._release is not None:
            self._release(job.result())

    async def drain(self) -> None:
        """Wait until the decodes whose callers went away have finished (and given back
        their canvases), then let the device calls' threads go."""
        with self._abandoned_lock:
            jobs = list(self._abandoned)
        if jobs:
            await asyncio.gather(*(asyncio.wrap_future(j) for j in jobs), return_exceptions=True)
        await asyncio.to_thread(self._device_threads.shutdown, True)

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting and self._running < self.in_flight:
            batch = self._waiting[: self.max_batch]
            del self._waiting[: self.max_batch]
            self._running += 1
            loop.create_task(self._run(loop, batch))

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[tuple[DecodeRequest, asyncio.Future[Prepared]]],
    ) -> None:
        if self.device is None:  # pragma: no cover - decode() batches only for a device
            raise RuntimeError("no device decoder")
        try:
            outcomes = await loop.run_in_executor(
                self._device_threads, self.device.decode_batch, [r for r, _ in batch]
            )
        except BaseException as e:  # a bug or a CUDA failure: every frame of it fails
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        finally:
            self._running -= 1
            self._kick(loop)
        self.batches += 1
        self.batched_frames += len(batch)
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():  # the frame's caller went away: its canvas goes back
                if isinstance(outcome, Prepared) and self._release is not None:
                    self._release(outcome)  # a no-op for a device canvas
                continue
            if isinstance(outcome, ClientError):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
