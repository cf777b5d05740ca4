"""The engine interface every backend implements, and the lookup by config string.

An engine runs the network only: it receives a batch of letterboxed uint8 BGR frames of
one shape and returns the raw outputs (batch-first numpy arrays). Normalisation happens
inside the engine so GPU engines can upload uint8 (4x fewer bytes) and normalise on the
device; pre- and post-processing otherwise stay outside.
"""

from __future__ import annotations

import asyncio
import importlib
import types
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ..common.buffers import Allocator
from ..common.metrics import Metrics
from ..config import Config, engine_sections
from ..errors import EngineError
from ..model.spec import ModelSpec, decide_max_batch

U8Array = npt.NDArray[np.uint8]
S = TypeVar("S")


class Engine(ABC):
    """Runs the network on batches; several batches may be in flight (``max_in_flight``)."""

    kind: ClassVar[str]

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        self.spec = spec
        self.config = config
        self._max_batch = decide_max_batch(spec, config.engine)

    @property
    def max_batch(self) -> int:
        """Largest batch :meth:`infer` takes: :func:`~edge_vision.model.spec.decide_max_batch`'s
        value, or less once the engine has narrowed it (:meth:`narrow_max_batch`)."""
        return self._max_batch

    def narrow_max_batch(self, limit: int) -> None:
        """Lower :attr:`max_batch` to what the backend accepts; it never grows."""
        self._max_batch = max(1, min(self._max_batch, limit))

    @property
    def max_in_flight(self) -> int:
        return self.config.engine.in_flight

    async def prepare(self, shapes: Sequence[tuple[int, int]]) -> None:  # noqa: B027
        """Before warm-up: build what each (H, W) input shape needs (CUDA graphs...)."""

    def bind_metrics(self, metrics: Metrics) -> None:  # noqa: B027 - optional hook
        """Engines with metrics of their own (Triton's queue/compute times) register here."""

    async def health(self) -> str | None:
        """None when the engine can serve; otherwise why not (shown in /readyz)."""
        return None

    def host_allocator(self) -> Allocator | None:
        """Allocator for host frame buffers (pinned memory on CUDA engines), or None."""
        return None

    @property
    def accepts_device_frames(self) -> bool:
        """True when :meth:`infer` also takes frames already on the GPU
        (:class:`~edge_vision.frames.decode_batch.DeviceFrame` canvases of the device decoder)."""
        return False

    @abstractmethod
    async def start(self) -> None:
        """Load (and if needed build) the engine. Raises EngineError."""

    @abstractmethod
    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        """Run one batch of same-shape HxWx3 uint8 BGR frames; outputs are batch-first.
        Engines that :attr:`accepts_device_frames` also take DeviceFrames among them."""

    @abstractmethod
    async def close(self) -> None:
        """Release every resource; safe to call twice."""

    def describe(self) -> dict[str, Any]:
        """What /readyz, hello and logs say about this engine."""
        return {"kind": self.kind, "max_batch": self.max_batch, "in_flight": self.max_in_flight}


class SlotPool(Generic[S]):
    """The in-flight slots of a GPU engine (stream, event, buffers, context): a batch takes
    one for its whole trip and gives it back. ``slots`` is the engine's own list, filled
    as it starts; the queue is made on first use, on the loop that serves."""

    def __init__(self, slots: list[S]) -> None:
        self._slots = slots
        self._free: asyncio.Queue[S] | None = None

    def _queue(self) -> asyncio.Queue[S]:
        if self._free is None:
            self._free = asyncio.Queue()
            for slot in self._slots:
                self._free.put_nowait(slot)
        return self._free

    async def get(self) -> S:
        """A free slot, waiting for one; give it back with :meth:`put`."""
        return await self._queue().get()

    def put(self, slot: S) -> None:
        self._queue().put_nowait(slot)

    @property
    def free(self) -> int:
        """How many slots are free now."""
        return self._queue().qsize()


def engine_class(kind: str) -> type[Engine]:
    """The Engine subclass of ``kind``: the one in module ``edge_vision.engines.<kind>``
    whose ``kind`` it is, imported now (not before: optional backends stay unimported).
    The kinds are the config's engine sections (:func:`edge_vision.config.engine_sections`);
    a missing library is one clear EngineError naming what to install."""
    sections = engine_sections()
    section = sections.get(kind)
    if section is None:
        raise EngineError(f"unknown engine {kind!r}; known: {', '.join(sections)}")
    try:
        module = importlib.import_module(f"{__package__}.{kind}")
    except ImportError as e:
        raise EngineError(
            f"engine {kind!r} cannot load: {e}. It needs: pip install {section.install}"
        ) from e
    found = [
        v
        for v in vars(module).values()
        # On Python 3.10 a parametrised alias such as ``np.ndarray[...]`` passes
        # isinstance(v, type) but makes issubclass raise: skip aliases.
        if isinstance(v, type)
        and not isinstance(v, types.GenericAlias)
        and issubclass(v, Engine)
        and v.__dict__.get("kind") == kind
    ]
    if len(found) != 1:
        raise RuntimeError(f"module {module.__name__} must define one Engine of kind {kind!r}")
    return found[0]


def create_engine(kind: str, spec: ModelSpec, config: Config) -> Engine:
    """Instantiate the engine of ``kind`` (:func:`engine_class`)."""
    return engine_class(kind)(spec, config)
