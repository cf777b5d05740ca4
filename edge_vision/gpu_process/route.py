"""Decode where there is capacity: which decoder takes each frame of a batch. Pure.

The GPU process has up to three ways to decode a JPEG: the GPU's hardware JPEG engine
(nvImageCodec's hardware backend: A100, H100, H200, a Jetson's NVJPG), the GPU's CUDA
decoder (nvImageCodec's CUDA backend, or nvJPEG through torchvision), and a pool of host
decoders (libjpeg-turbo, one frame a thread, frames/decode.py). On an H100 the hardware
engine alone carries about 128 cameras at 30 fps with no headroom (docs/benchmarks.md), so
each batch is split by :func:`split_batch` from what each route has queued now and how fast
it has been decoding (:class:`RateMeter`, frames a second, measured per call): the hardware
engine takes every frame it would get to within :data:`SPILL_AFTER_S`; beyond that backlog
each frame goes where it would be done first, so the CUDA decoder and the host take the
overflow in proportion to their speed (a host decoder is never sooner than one frame's
decode on one core: :attr:`RouteLoad.floor_s`). No fixed split is configured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The routes, in the order a tie goes (the cheapest for the host first).
ROUTES = ("hw", "cuda", "host")
#: The hardware engine takes every frame it would get to within this long (one frame
#: interval at 30 fps): an overflow beyond it spills to the other routes. 10 ms spilled
#: half of each batch to the host at 64 cameras on an H100 (docs/benchmarks.md, 2026-12-07).
SPILL_AFTER_S = 0.033


@dataclass(frozen=True, slots=True)
class RouteLoad:
    """One route as the split sees it."""

    queued: int  # frames given to it and not decoded yet
    rate: float  # frames a second it decodes (measured; a prior until then)
    floor_s: float = 0.0  # the soonest it can be done with any one frame


def split_batch(
    frames: int, loads: Mapping[str, RouteLoad], spill_after_s: float = SPILL_AFTER_S
) -> dict[str, int]:
    """How many of ``frames`` each route in ``loads`` takes, frame by frame: the first
    route in :data:`ROUTES` order (the hardware engine: it costs neither the SMs the
    engine needs nor host cores) while it would get to the frame within ``spill_after_s``
    (``(queued + given + 1) / rate``); past that, the route that would be done with it
    first, the earlier in :data:`ROUTES` on a tie. A route with no rate takes nothing;
    with no route at all, ValueError."""
    usable = [r for r in ROUTES if r in loads and loads[r].rate > 0]
    usable += [r for r in loads if r not in ROUTES and loads[r].rate > 0]
    if not usable:
        raise ValueError("no decode route can take frames")
    given = dict.fromkeys(loads, 0)

    def done_after(r: str) -> float:
        load = loads[r]
        return max(load.floor_s, (load.queued + given[r] + 1) / load.rate)

    first = usable[0]
    for _ in range(frames):
        if done_after(first) <= spill_after_s:
            best = first
        else:
            best = min(usable, key=lambda r: (done_after(r), usable.index(r)))
        given[best] += 1
    return given


def assign(frames: int, split: Mapping[str, int]) -> list[str]:
    """Frame ``i``'s route, for ``split`` taken in :data:`ROUTES` order (the batch's first
    frames to the hardware engine)."""
    order = [r for r in ROUTES if r in split] + [r for r in split if r not in ROUTES]
    routes: list[str] = []
    for r in order:
        routes += [r] * split[r]
    if len(routes) != frames:
        raise ValueError(f"a split of {len(routes)} frames for {frames}")
    return routes


class RateMeter:
    """A route's decode rate in frames a second: a prior until its first call, then an
    exponentially weighted mean of each call's frames over its seconds (the newest call
    weighs ``weight``)."""

    def __init__(self, prior: float, weight: float = 0.2) -> None:
        if prior <= 0 or not 0 < weight <= 1:
            raise ValueError("a rate meter needs a positive prior and 0 < weight <= 1")
        self.rate = prior
        self.weight = weight
        self.calls = 0

    def observe(self, frames: int, seconds: float) -> float:
        if frames > 0 and seconds > 0:
            measured = frames / seconds
            w = 1.0 if self.calls == 0 else self.weight
            self.rate += w * (measured - self.rate)
            self.calls += 1
        return self.rate


#: Each route's frames a second of 1280x720 JPEGs until it has been measured here: the
#: hardware JPEG engine, the CUDA decoder while the SMs have room, and one host core with
#: libjpeg-turbo at DCT 1/2 (the figures: docs/benchmarks.md, "the one-process ceiling").
PRIOR_RATES = {"hw": 5000.0, "cuda": 3000.0, "host_per_thread": 267.0}


def loads_of(
    queued: Mapping[str, int],
    meters: Mapping[str, RateMeter],
    floors: Mapping[str, float] | None = None,
) -> dict[str, RouteLoad]:
    floors = floors or {}
    return {r: RouteLoad(queued.get(r, 0), m.rate, floors.get(r, 0.0)) for r, m in meters.items()}


def describe(split: Mapping[str, int], routes: Sequence[str] = ROUTES) -> str:
    return ", ".join(f"{r} {split.get(r, 0)}" for r in routes if r in split)
