"""``edge-vision bench``: load tests that measure what a camera client sees.

    edge-vision bench --cameras 4 --fps 15 --duration 30            # start a server, load it
    edge-vision bench --url ws://host:8080/ws --cameras 8 --fps 30  # load a running server
    edge-vision bench --engine-only                                 # the engine's ceiling
    edge-vision bench --compare --cameras 4 --fps 15 --duration 30  # ceiling, ours, baseline
    edge-vision bench --ceiling --cameras 32 --fps 30               # ceiling and ours
    edge-vision bench --cameras 1,2,4,8 --fps 15 --duration 20      # a sweep, with plots

Each run prints a table and writes ``results.json`` and PNG plots (latency distribution;
throughput and p99 against the number of cameras) to ``--out``.
"""

from __future__ import annotations

from typing import Any


def register_cli(sub: Any) -> None:
    """Register ``bench`` (the command module, and the CLI it needs, load on demand, so
    camera processes that import this package stay light and free of import cycles)."""
    from .command import register

    register(sub)
