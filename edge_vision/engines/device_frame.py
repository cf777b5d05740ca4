"""A frame already on the GPU: what a device decoder hands the CUDA engines.

It lives with the engines, below the frame path, because both sides use it: the device
decoder (:mod:`edge_vision.frames.decode_gpu`) makes it, a CUDA engine's stream waits for
it (:func:`wait_ready`) and reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True, eq=False)
class DeviceFrame:
    """A letterboxed canvas on the GPU and when it is complete.

    ``tensor``: the ``out_h × out_w × 3`` uint8 BGR torch CUDA tensor. ``ready``: a CUDA
    event recorded on the decoder's stream after the decode and letterbox that write it
    (None: complete already, the decoder's ``wait`` host). An engine's stream waits for it
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
