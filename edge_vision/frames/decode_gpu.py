"""The device decoder: JPEGs decoded in batches on the GPU, then letterboxed there.

:class:`CudaBatchDecoder` is the :class:`~edge_vision.frames.decode_batch.BatchDecoder` that
:class:`~edge_vision.frames.decode_batch.DecodeBatcher` feeds when a CUDA engine serves
(``decode.device``): a list of frames decoded on the GPU by nvImageCodec
(:class:`NvImgCodecJpeg`: the GPU's hardware JPEG engine, then its CUDA decoder; chosen by
``decode.device_library``) or by nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``,
whose Huffman stage runs on the host; then letterboxed (area resize when shrinking,
bilinear when enlarging, as :func:`~edge_vision.model.shape.letterbox_into` picks) on the device
into uint8 BGR canvases that the CUDA engines stack or copy into their input batch;
normalisation runs inside the engine. Frames it does not take
(:func:`~edge_vision.frames.decode_batch.device_decodable`) and frames the GPU library refuses go
to the host decoder, one by one.

For torchvision's nvJPEG, compressed bytes are staged in a pool of their own
(``staging``: pinned host memory from the CUDA layer when a CUDA engine is active);
nvImageCodec reads them where they are.

Stream ordering: the GPU decode and the letterbox run on the decoder's own CUDA stream.
With ``wait`` host (what the service runs), :meth:`CudaBatchDecoder.decode_batch`
returns once its stream has finished (the wait blocks the worker thread, not the event
loop). With ``stream`` it returns once that work is queued: each canvas is a
:class:`~edge_vision.frames.decode_batch.DeviceFrame` carrying an event recorded after it, and the
engine's stream waits for that event on the GPU before it reads the canvas
(:func:`~edge_vision.frames.decode_batch.wait_ready`), so the decoder's thread does not wait for
its letterbox (torchvision's nvJPEG still waits for the stream before each decode: see
:meth:`CudaBatchDecoder.decode_pixels`). A canvas's memory goes back to torch's caching
allocator only when the last reference goes, and to the decoder's stream, whose later work
runs after the work that wrote it; the engine slot holds a reference until its batch's
event has completed (:class:`~edge_vision.engines.gpu_base.GpuEngine`), so no decode can
write into memory an engine stream still has queued work on, even when the frame's caller
is gone. The decoded full-size images, whose memory is nvImageCodec's, are held by the
decoder until the letterbox that reads them has run. tests/gpu/test_decode_gpu.py checks
that under concurrent load; ``python -m benchmarks.device_decode`` times each stage's
host CPU a frame.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from ..common.buffers import Allocator, BufferPool, numpy_allocator
from ..engines.device_frame import DeviceFrame
from ..errors import ClientError, ConfigError
from ..model.shape import Letterbox, area_taps
from .decode_batch import DecodeRequest, HostBatchDecoder, Outcome, Prepared, device_decodable

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


class NvImgCodecJpeg:
    """nvImageCodec's batched JPEG decode (``nvidia.nvimgcodec``) into ``3 × H × W`` RGB
    torch tensors on the device: the GPU's hardware JPEG engine first (A100, H100, H200,
    Jetson Orin), then nvImageCodec's CUDA decoder for what the engine does not take. Unlike
    torchvision's batched nvJPEG, whose Huffman stage runs on the host, the hardware path
    leaves the host only the header parse. It reads the bytes from host memory itself, so
    no staging copy is needed. One decoder per CUDA stream: calls on different streams may
    run at once from different worker threads.
    """

    def __init__(
        self, torch: Any, device: Any, cpu_threads: int, backends: Sequence[str] = ("hw", "cuda")
    ) -> None:
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
        # "hw": the hardware JPEG engine, "cuda": the CUDA decoder; the GPU process keeps one
        # decoder of each, to route frames to whichever has room (gpu_process/route.py).
        self.backends = tuple(backends)
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
                kind_of = {"hw": nv.BackendKind.HW_GPU_ONLY, "cuda": nv.BackendKind.GPU_ONLY}
                backends = [nv.Backend(kind_of[b]) for b in self.backends]
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
    ``wait``: ``host`` (what the service runs), the decoder's thread waits for its stream;
    ``stream``, each canvas carries an event the engine's stream waits for on the GPU.
    ``backends`` (nvImageCodec): ``hw`` the hardware JPEG engine, ``cuda`` the CUDA decoder,
    tried in that order.
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
        backends: Sequence[str] = ("hw", "cuda"),
    ) -> None:
        cuda = device.startswith("cuda")
        self.wait = wait  # who waits for the decoder's stream (tests try both)
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
                self.nvimgcodec = NvImgCodecJpeg(torch, self.device, cpu_threads, backends)
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
        self.refusals = 0  # batches with frames the GPU decoder refused (to the host)
        # nvImageCodec's backends, for the logs (torchvision's nvJPEG has no such choice)
        self.backends = tuple(backends) if self.nvimgcodec is not None else ()
        # (event, decoded images) of batches whose letterbox may still be queued (_ready)
        self._reading: collections.deque[tuple[Any, list[Any]]] = collections.deque()
        self.warm_error: str | None = None  # why nvImageCodec's warm-up failed, if it did
        if self.nvimgcodec is not None:
            self._warm(self.nvimgcodec, max(1, streams))

    def _warm(self, codec: NvImgCodecJpeg, streams: int) -> None:
        """Each stream's nvImageCodec decoder made and run once now, not on the first
        camera frames, which would otherwise wait seconds for them (docs/benchmarks.md,
        "where the CPU went, and the GPU frame path")."""
        tiny = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))[1].tobytes()
        held = [self._streams.get() for _ in range(streams)]
        try:
            for stream in held:
                warmed = codec.decode([tiny], stream)
                self._wait(stream)  # before the decoded image's memory can go
                del warmed
        except Exception as e:  # noqa: BLE001 - a slow first frame, not a failed start
            self.warm_error = str(e)
            log.warning(
                "nvImageCodec warm-up failed (%s decoder: %s); its first frames will be slower",
                "+".join(codec.backends),
                e,
            )
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
        event, where ``Stream.synchronize`` spins a core for the whole wait, which under load
        adds up to a large share of the server's CPU (docs/benchmarks.md, "where the CPU
        went, and the GPU frame path")."""
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

    def _say_refused(self, frames: int, error: Any) -> None:
        """Frames the GPU decoder refused go to the host decoder in this thread, one by
        one: said at WARNING the first time (with what the library raised, or that it
        gave no image) and counted in ``refusals`` and ``host_frames`` after: a decoder
        that refuses every frame makes its route a slow host path, which must show."""
        with self._lock:
            first = self.refusals == 0
            self.refusals += 1
        if first:
            log.warning(
                "%s%s refused %d frame(s) of a batch (%s); they are decoded on the host, "
                "and later refusals are counted, not logged",
                self.library,
                f" ({'+'.join(self.backends)})" if self.backends else "",
                frames,
                error,
            )

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
                    self._say_refused(len(refused), pixels[to_device.index(refused[0])])
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
    does (:func:`~edge_vision.model.shape.area_taps`): width, then height, each output a weighted
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
    """:func:`~edge_vision.model.shape.area_taps` on ``device``, made once per size (a copy to
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
    backends: Sequence[str] = ("hw", "cuda"),
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
            backends=backends,
        )
    except Exception as e:  # noqa: BLE001 - degrade to host decode, said in the log
        if device == "cuda":
            log.error("decode.device cuda unavailable, decoding on the host: %s", e)
        else:
            log.info("decode.device auto: decoding on the host (%s)", e)
        return None
