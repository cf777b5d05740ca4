"""The GPU process's frame path: the frame pipeline with its decode split across routes.

:class:`RoutedDecoder` is the :class:`~edge_vision.frames.decode_batch.BatchDecoder` the
GPU process's :class:`~edge_vision.frames.decode_batch.DecodeBatcher` feeds: each batch of
JPEGs is split by :func:`~.route.split_batch` between the hardware JPEG engine and the CUDA
decoder (each a :class:`~edge_vision.frames.decode_gpu.CudaBatchDecoder` with one
nvImageCodec backend; nvJPEG through torchvision is the CUDA route where nvImageCodec is
missing) and the host decoders (the pipeline's host path, frames/decode.py, one frame a
thread of its pool), from how many frames each has queued and how fast each decoded lately.

:class:`GpuSidePipeline` is the frame pipeline the GPU process runs: the same
:class:`~edge_vision.frames.pipeline.FramePipeline` as a worker's, whose device decoder,
once a CUDA engine is active, is a :class:`RoutedDecoder`. On the CPU stand-in (ONNX
Runtime) no device decoder starts and every frame takes the host path, as in a worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, wait
from functools import partial
from typing import Any

from ..common.buffers import Allocator
from ..common.threads import role_pool
from ..engines import Engine
from ..errors import ClientError
from ..frames.decode_batch import (
    BatchDecoder,
    DecodeRequest,
    HostBatchDecoder,
    Outcome,
    Prepared,
    device_decodable,
)
from ..frames.decode_gpu import make_device_decoder
from ..frames.pipeline import FramePipeline, worker_count
from .route import PRIOR_RATES, RateMeter, assign, describe, loads_of, split_batch

log = logging.getLogger(__name__)

#: How often the routed decoder logs what each route decoded (INFO).
ROUTES_LOG_S = 30.0


class RoutedDecoder:
    """Splits each batch between the device routes and the host (module docstring)."""

    name = "routed"

    def __init__(
        self,
        devices: Mapping[str, BatchDecoder],
        host: HostBatchDecoder,
        host_pool: Executor,
        host_threads: int,
        side_threads: int = 2,
    ) -> None:
        self.devices = dict(devices)
        self.host = host
        self._pool = host_pool
        # The routes after the first run beside it, on threads of their own (one a decode
        # call in flight: ``side_threads``, decode.device_streams), so the hardware
        # engine's frames never wait behind the CUDA decoder's (its Huffman stage is host
        # work) or the host's.
        self._side = {
            r: role_pool(max(1, side_threads), f"gpu-decode-{r}") for r in list(self.devices)[1:]
        }
        self.meters = {r: RateMeter(PRIOR_RATES[r]) for r in self.devices}
        self.meters["host"] = RateMeter(PRIOR_RATES["host_per_thread"] * max(1, host_threads))
        # One host decoder is never done with a frame sooner than one core decodes it.
        self._floors = {"host": 1.0 / PRIOR_RATES["host_per_thread"]}
        self._queued: dict[str, int] = dict.fromkeys(self.meters, 0)
        self._lock = threading.Lock()
        self.frames = Counter[str]()  # frames each route decoded (logs, tests)
        self._said_at = time.monotonic()

    @property
    def device(self) -> Any:
        first = next(iter(self.devices.values()), None)
        return getattr(first, "device", "host")

    @property
    def library(self) -> str:
        libs = [str(getattr(d, "library", r)) for r, d in self.devices.items()]
        return "+".join(dict.fromkeys(libs)) + " (routed: " + ", ".join(self.meters) + ")"

    def takes(self, request: DecodeRequest) -> bool:
        return device_decodable(request)

    def set_staging_allocator(self, allocator: Allocator) -> None:
        for d in self.devices.values():
            d.set_staging_allocator(allocator)

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        n = len(requests)
        with self._lock:
            split = split_batch(n, loads_of(self._queued, self.meters, self._floors))
            for r, k in split.items():
                self._queued[r] += k
            self._say_routes()
        routes = assign(n, split)
        log.debug("decode split: %s", describe(split))
        out: list[Outcome | None] = [None] * n
        t0 = time.perf_counter()
        host = [
            (i, self._pool.submit(self.host.decode_one, requests[i]))
            for i in range(n)
            if routes[i] == "host"
        ]
        try:
            side = []
            first = None
            for route, decoder in self.devices.items():
                idx = [i for i in range(n) if routes[i] == route]
                if not idx:
                    continue
                if route in self._side:
                    call = partial(self._device_call, route, decoder, requests, idx, out)
                    side.append(self._side[route].submit(call))
                else:
                    first = (route, decoder, idx)
            try:
                if first is not None:
                    self._device_call(first[0], first[1], requests, first[2], out)
            finally:  # the other routes' calls are done with ``out`` before this returns
                wait(side)
            for fut in side:
                fut.result()  # a route's failure fails the call, as the first route's does
            self._host_results(host, out, t0)
        finally:
            with self._lock:
                for r, k in split.items():
                    self._queued[r] -= k
        return [o if o is not None else ClientError("bad_image", "not decoded") for o in out]

    def close(self) -> None:
        """Stop the side routes' threads (idle ones; a call in progress finishes)."""
        for pool in self._side.values():
            pool.shutdown(wait=False)

    def _say_routes(self) -> None:
        """Every :data:`ROUTES_LOG_S`: the frames each route decoded and its rate now."""
        now = time.monotonic()
        if now - self._said_at < ROUTES_LOG_S or not self.frames:
            return
        self._said_at = now
        log.info(
            "decode routes so far: %s",
            ", ".join(
                f"{r} {self.frames[r]} frames at {m.rate:.0f}/s{self._fell_back(r)}"
                for r, m in self.meters.items()
            ),
        )

    def _fell_back(self, route: str) -> str:
        """`` (N of them decoded on the host)`` for a device route whose decoder sent
        frames to the host decoder instead (frames its GPU library refused)."""
        host = int(getattr(self.devices.get(route), "host_frames", 0) or 0)
        return f" ({host} of them decoded on the host)" if host else ""

    def _device_call(
        self,
        route: str,
        decoder: BatchDecoder,
        requests: Sequence[DecodeRequest],
        idx: list[int],
        out: list[Outcome | None],
    ) -> None:
        t0 = time.perf_counter()
        got = decoder.decode_batch([requests[i] for i in idx])
        with self._lock:
            self.meters[route].observe(len(idx), time.perf_counter() - t0)
            self.frames[route] += len(idx)
        for i, outcome in zip(idx, got, strict=True):
            out[i] = outcome

    def _host_results(
        self, host: list[tuple[int, Future[Prepared]]], out: list[Outcome | None], t0: float
    ) -> None:
        for i, fut in host:
            try:
                out[i] = fut.result()
            except ClientError as e:
                out[i] = e
        if host:
            with self._lock:
                self.meters["host"].observe(len(host), time.perf_counter() - t0)
                self.frames["host"] += len(host)


def device_routes(
    library: str, one: Callable[[str, tuple[str, ...]], BatchDecoder | None]
) -> dict[str, BatchDecoder]:
    """The GPU process's device decode routes, each made by ``one(library, backends)``:
    nvImageCodec's hardware JPEG engine alone (``hw``) and its CUDA decoder alone
    (``cuda``); torchvision's nvJPEG as the ``cuda`` route alone. A decoder whose warm-up
    failed is not a route: every batch it got would fail and go to the host decoders
    (the CUDA-only decoder never started on an H100: docs/benchmarks.md, "a decoder of
    the GPU process that never started"). A hardware-only decoder that fails gives way to
    the decoder a worker uses, both backends in one (``hw+cuda``), as route ``hw``;
    failing too, the CUDA decoder alone; failing too, no device route (the host
    decodes)."""

    def started(backends: tuple[str, ...]) -> BatchDecoder | None:
        made = one("nvimgcodec", backends)
        failed = getattr(made, "warm_error", None)
        if failed:
            log.warning(
                "GPU process: nvImageCodec's %s decoder did not start (%s); no frame goes to it",
                "+".join(backends),
                failed,
            )
            return None
        return made

    first = one(library, ("hw",))
    if first is None:
        return {}
    if getattr(first, "library", "") != "nvimgcodec":
        return {"cuda": first}  # torchvision's nvJPEG: the CUDA route alone
    failed = getattr(first, "warm_error", None)
    if failed:
        log.warning(
            "GPU process: nvImageCodec's hardware-only decoder did not start (%s); its "
            "hardware engine and CUDA decoder in one decoder instead",
            failed,
        )
        both = started(("hw", "cuda"))
        if both is not None:
            return {"hw": both}
        cuda = started(("cuda",))
        return {"cuda": cuda} if cuda is not None else {}
    devices = {"hw": first}
    cuda = started(("cuda",))
    if cuda is not None:
        devices["cuda"] = cuda
    return devices


class GpuSidePipeline(FramePipeline):
    """The frame pipeline of the GPU process (module docstring)."""

    async def close(self) -> None:
        await super().close()
        if isinstance(self.decoding.device, RoutedDecoder):
            self.decoding.device.close()

    def _engine_changed(self, engine: Engine) -> None:
        d = self.config.decode
        if self.decoding.device is None and engine.accepts_device_frames and d.device != "host":
            self.decoding.device = self._routed(engine)
        super()._engine_changed(engine)

    def _routed(self, engine: Engine) -> RoutedDecoder | None:
        d = self.config.decode
        allocator = engine.host_allocator()
        threads = max(1, worker_count(0) // max(1, d.device_streams))

        def one(library: str, backends: tuple[str, ...]) -> BatchDecoder | None:
            kw: dict[str, Any] = {"staging": allocator} if allocator is not None else {}
            return make_device_decoder(
                d.device,
                self.host_decoder,
                streams=d.device_streams,
                library=library,
                cpu_threads=threads,
                backends=backends,
                **kw,
            )

        devices = device_routes(d.device_library, one)
        if not devices:
            return None
        host_threads = worker_count(d.workers)
        routed = RoutedDecoder(
            devices, self.host_decoder, self.executor, host_threads, d.device_streams
        )
        log.info("GPU process decode routes: %s", ", ".join(routed.meters))
        return routed
