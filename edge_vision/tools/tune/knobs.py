"""Which settings ``tune`` searches on this machine's engine, and with which values.

Only settings that measured to matter for throughput or latency on that kind of engine
(docs/benchmarks.md); each value list starts from what the node runs anyway.
"""

from __future__ import annotations

from typing import Any

from ...config import Config
from .search import Knob


def _around(value: int, low: int = 1) -> tuple[int, ...]:
    """``value``, half of it and one and a half of it, each at least ``low``, in order."""
    return tuple(dict.fromkeys(max(low, v) for v in (value, value // 2, value + value // 2)))


def knobs_for(config: Config, cores: int, input_sizes: tuple[int, ...] = ()) -> list[Knob]:
    """The knobs worth searching for ``config``'s (resolved) engine on ``cores`` cores."""
    found: list[Knob]
    if config.engine.kind in ("torch", "tensorrt"):
        found = [
            Knob(
                "server.workers",
                _around(config.server.workers),
                "processes that decode and post-process; more share one GPU",
            ),
            Knob(
                "decode.device_window_ms",
                tuple(dict.fromkeys((config.decode.device_window_ms, 0.0, 12.0, 20.0))),
                "a wait that gathers more frames a GPU decode call: less CPU a frame, more latency",
            ),
            Knob(
                "engine.max_batch",
                tuple(dict.fromkeys((config.engine.max_batch, 8, 32))),
                "the largest engine batch across cameras",
            ),
        ]
    else:
        threads = config.engine.onnxruntime.threads
        found = [
            Knob(
                "engine.onnxruntime.threads",
                tuple(dict.fromkeys((threads, 0, max(1, cores // 2)))),
                "ONNX Runtime's threads for one inference (0: one a core)",
            ),
        ]
        if cores >= 2:
            found.append(
                Knob(
                    "server.workers",
                    tuple(dict.fromkeys((config.server.workers, 1, 2))),
                    "processes serving the port, each with its own engine",
                )
            )
    if input_sizes:
        found.append(
            Knob(
                "model.input_size",
                tuple(dict.fromkeys((config.model.input_size, *input_sizes))),
                "the engine input's long side (asked for with --input-sizes)",
            )
        )
    return found


def current(config: Config, knobs: list[Knob]) -> dict[str, Any]:
    """What ``config`` sets for each knob's key."""
    out: dict[str, Any] = {}
    for knob in knobs:
        node: Any = config
        for part in knob.key.split("."):
            node = getattr(node, part)
        out[knob.key] = node
    return out
