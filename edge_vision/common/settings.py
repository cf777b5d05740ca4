"""Plain types of a session's settings, shared by the config, the protocol's messages, the
session core, the session record, the pipeline, the client and replay. Nothing but
``typing`` and ``dataclasses`` is imported here, so any module (the client users embed,
the sans-I/O session core) can use them for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeGuard, get_args

#: How a session admits frames (docs/protocol.md, ``settings.mode``): ``latest`` serves
#: the newest frame and drops the ones it replaces; ``every`` answers every frame in order.
Mode = Literal["latest", "every"]

#: The values of :data:`Mode`, in its order.
MODES: tuple[Mode, ...] = get_args(Mode)


def is_mode(value: object) -> TypeGuard[Mode]:
    """True when ``value`` (a query parameter, a settings field) is one of :data:`MODES`."""
    return value in MODES


@dataclass(frozen=True, slots=True)
class FrameSettings:
    """What a session asked for: score threshold, class filter and input size."""

    confidence: float
    classes: frozenset[int] | None = None
    # Target long side of the engine input (one of model.input_sizes); None: the server's.
    input_size: int | None = None
