"""Decode where there is capacity: the split of a batch between the hardware JPEG engine,
the CUDA decoder and the host decoders from literal queue depths and rates, and the routed
decoder that carries it out (device decoders stood in for by recording fakes)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from edge_vision.common.buffers import Allocator
from edge_vision.errors import ClientError
from edge_vision.frames.decode import read_image_header
from edge_vision.frames.decode_batch import DecodeRequest, HostBatchDecoder, Outcome, Prepared
from edge_vision.gpu_process.decoders import RoutedDecoder, device_routes
from edge_vision.gpu_process.route import RateMeter, RouteLoad, assign, split_batch
from edge_vision.model.shape import Letterbox

from ..support.images import text_scene

HW, CUDA, HOST = 5000.0, 3000.0, 534.0  # frames/s: the priors, two host threads


def loads(hw: int, cuda: int, host: int) -> dict[str, RouteLoad]:
    return {"hw": RouteLoad(hw, HW), "cuda": RouteLoad(cuda, CUDA), "host": RouteLoad(host, HOST)}


def test_an_idle_hardware_engine_takes_the_whole_batch() -> None:
    assert split_batch(64, loads(0, 0, 0)) == {"hw": 64, "cuda": 0, "host": 0}
    # What it would reach only after 33 ms (one frame interval at 30 fps) spills: 200
    # frames are 40 ms of its work.
    spilled = split_batch(200, loads(0, 0, 0))
    assert spilled["hw"] == 165 and spilled["cuda"] + spilled["host"] == 35


def test_a_backed_up_hardware_engine_sends_the_overflow_where_it_is_done_sooner() -> None:
    # 400 frames queued on the engine are 80 ms of work: the CUDA decoder finishes a frame
    # sooner until its own queue is that long, and the host takes a share too.
    split = split_batch(64, loads(400, 0, 0))
    assert split["cuda"] > 0 and split["host"] > 0
    assert split["hw"] == 0  # 400 queued are 80 ms of its work: past the spill
    assert split["cuda"] > split["host"]  # in proportion to their speed
    assert sum(split.values()) == 64


def test_a_busy_host_pool_gets_nothing_while_the_gpu_has_room() -> None:
    split = split_batch(16, loads(10, 0, 200))
    assert split["host"] == 0 and split["hw"] + split["cuda"] == 16


def test_a_host_decoder_is_never_sooner_than_one_frame_on_one_core() -> None:
    # A pool of 64 host threads has a large summed rate, but each frame still takes a
    # core 3.7 ms: while the GPU's routes are done sooner, the host gets nothing.
    many = {
        "hw": RouteLoad(200, HW),
        "cuda": RouteLoad(0, CUDA),
        "host": RouteLoad(0, 64 * 267.0, 1 / 267.0),
    }
    assert split_batch(8, many)["host"] == 0
    no_floor = {**many, "host": RouteLoad(0, 64 * 267.0)}
    assert split_batch(8, no_floor)["host"] > 0


def test_a_route_without_a_rate_takes_nothing_and_no_route_is_an_error() -> None:
    only_host = {"hw": RouteLoad(0, 0.0), "host": RouteLoad(5, HOST)}
    assert split_batch(4, only_host) == {"hw": 0, "host": 4}
    with pytest.raises(ValueError):
        split_batch(1, {"hw": RouteLoad(0, 0.0)})


def test_frames_are_assigned_in_route_order() -> None:
    assert assign(5, {"host": 1, "hw": 2, "cuda": 2}) == ["hw", "hw", "cuda", "cuda", "host"]
    with pytest.raises(ValueError):
        assign(3, {"hw": 1})


def test_the_rate_follows_what_each_call_measured() -> None:
    m = RateMeter(5000.0, weight=0.5)
    assert m.observe(100, 0.1) == 1000.0  # the first call replaces the prior
    assert m.observe(100, 0.05) == 1500.0
    assert m.observe(0, 0.0) == 1500.0  # nothing measured, nothing learnt
    with pytest.raises(ValueError):
        RateMeter(0.0)


class FakeDevice:
    """Stands in for a device decoder: records each call, answers a canvas a frame."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[int] = []

    def takes(self, request: DecodeRequest) -> bool:
        return True

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        self.calls.append(len(requests))
        return [Prepared(self.name, r.letterbox, 0.0, 0.0, on_device=True) for r in requests]

    def set_staging_allocator(self, allocator: Allocator) -> None:
        pass


def request(data: bytes) -> DecodeRequest:
    return DecodeRequest(data, read_image_header(data), Letterbox(64, 48, 64, 48, 64, 48, 0, 0))


def test_the_routed_decoder_splits_by_queue_and_answers_every_frame_in_order() -> None:
    good = text_scene(64, 48).jpeg()
    bad = good[: len(good) // 2]  # a cut body: the host decoder refuses it alone

    def host_one(r: DecodeRequest) -> Prepared:
        if r.data is bad:
            raise ClientError("bad_image", "corrupt")
        return Prepared("host", r.letterbox, 0.0, 0.0)

    hw, cuda = FakeDevice("hw"), FakeDevice("cuda")
    with ThreadPoolExecutor(2) as pool:
        routed = RoutedDecoder({"hw": hw, "cuda": cuda}, HostBatchDecoder(host_one, 0), pool, 2)
        assert (
            routed.decode_batch([request(good)] * 8)
            == [Prepared("hw", request(good).letterbox, 0.0, 0.0, on_device=True)] * 8
        )
        # The engine and the CUDA decoder backed up by other calls in flight, at the
        # rates measured on a GPU (the fakes answer in no time at all).
        routed._queued.update(hw=400, cuda=200)
        routed.meters["hw"].rate, routed.meters["cuda"].rate = HW, CUDA
        out = routed.decode_batch([request(good)] * 6 + [request(bad)])
    assert [getattr(o, "canvas", None) for o in out[:6]] == ["host"] * 6
    assert isinstance(out[6], ClientError) and out[6].code == "bad_image"
    assert hw.calls == [8] and cuda.calls == []
    assert routed.frames == {"hw": 8, "host": 7}


def no_host(r: DecodeRequest) -> Prepared:
    raise AssertionError("no frame should reach the host here")


class WaitingDevice(FakeDevice):
    """A device route whose call waits (up to 5 s) for ``other``'s call to have started:
    it answers only once both run at the same time."""

    def __init__(self, name: str, started: threading.Event, other: threading.Event) -> None:
        super().__init__(name)
        self.started, self.other, self.saw_other = started, other, False

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        self.started.set()
        self.saw_other = self.other.wait(5.0)
        return super().decode_batch(requests)


def test_the_hardware_engine_does_not_wait_behind_the_cuda_decoder() -> None:
    # Each route's frames are decoded beside the others' (the CUDA decoder's Huffman stage
    # is host work): the hardware engine's call and the CUDA decoder's run at once.
    hw_started, cuda_started = threading.Event(), threading.Event()
    hw = WaitingDevice("hw", hw_started, cuda_started)
    cuda = WaitingDevice("cuda", cuda_started, hw_started)
    good = text_scene(64, 48).jpeg()
    with ThreadPoolExecutor(2) as pool:
        routed = RoutedDecoder({"hw": hw, "cuda": cuda}, HostBatchDecoder(no_host, 0), pool, 2)
        routed._queued.update(hw=160)  # the engine nearly backed up: some frames spill
        routed.meters["hw"].rate, routed.meters["cuda"].rate = HW, CUDA
        routed.meters["host"].rate = 1e-9  # and none to the host
        out = routed.decode_batch([request(good)] * 8)
    assert hw.calls and cuda.calls and sum(hw.calls) + sum(cuda.calls) == 8
    assert hw.saw_other and cuda.saw_other
    assert all(isinstance(o, Prepared) for o in out)


def test_the_routes_log_says_how_many_of_a_routes_frames_the_host_decoded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GPU decoder that refuses frames sends them to the host decoder in its own thread:
    # the route's line says so, or a refusing hardware engine reads as a slow one.
    hw = FakeDevice("hw")
    hw.host_frames = 1  # type: ignore[attr-defined]  # one of its two frames refused
    monkeypatch.setattr("edge_vision.gpu_process.decoders.ROUTES_LOG_S", 0.0)
    good = text_scene(64, 48).jpeg()
    with ThreadPoolExecutor(2) as pool, caplog.at_level(logging.INFO):
        routed = RoutedDecoder({"hw": hw}, HostBatchDecoder(no_host, 0), pool, 2)
        routed.decode_batch([request(good)] * 2)
        routed.decode_batch([request(good)] * 2)
    said = [r.getMessage() for r in caplog.records if "decode routes so far" in r.getMessage()]
    assert said and "hw 2 frames" in said[0] and "(1 of them decoded on the host)" in said[0]


class _Made:
    """A device decoder as make_device_decoder returns it, for device_routes: its library,
    its backends and whether its warm-up failed (mock: no GPU here)."""

    def __init__(self, library: str, backends: tuple[str, ...], warm_error: str | None) -> None:
        self.library, self.backends, self.warm_error = library, backends, warm_error


def _factory(fails: set[tuple[str, ...]], library: str = "nvimgcodec") -> object:
    def one(_lib: str, backends: tuple[str, ...]) -> _Made:
        return _Made(library, backends, "Could not create decoder" if backends in fails else None)

    return one


def test_mock_gpu_routes_are_the_hardware_engine_and_the_cuda_decoder_when_both_start() -> None:
    routes = device_routes("auto", _factory(set()))  # type: ignore[arg-type]
    assert {r: d.backends for r, d in routes.items()} == {"hw": ("hw",), "cuda": ("cuda",)}  # type: ignore[attr-defined]


def test_mock_gpu_a_hardware_decoder_that_cannot_start_is_replaced_by_both_backends_in_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the H100 the hardware-only decoder failed to start and its route decoded at host
    speed: no frame may be routed to a decoder whose warm-up failed."""
    with caplog.at_level(logging.WARNING):
        routes = device_routes("auto", _factory({("hw",)}))  # type: ignore[arg-type]
    assert {r: d.backends for r, d in routes.items()} == {"hw": ("hw", "cuda")}  # type: ignore[attr-defined]
    assert "hardware-only decoder did not start (Could not create decoder)" in caplog.text
    cuda_fails = device_routes("auto", _factory({("cuda",)}))  # type: ignore[arg-type]
    assert list(cuda_fails) == ["hw"]
    both_fail = device_routes("auto", _factory({("hw",), ("hw", "cuda")}))  # type: ignore[arg-type]
    assert {r: d.backends for r, d in both_fail.items()} == {"cuda": ("cuda",)}  # type: ignore[attr-defined]
    every = {("hw",), ("hw", "cuda"), ("cuda",)}
    assert device_routes("auto", _factory(every)) == {}  # type: ignore[arg-type]
    assert device_routes("auto", _factory(set(), library="torchvision")).keys() == {"cuda"}  # type: ignore[arg-type]
