"""``edge-vision tune``: fit this machine to a stated load, by measuring it.

    edge-vision tune --cameras 16 --fps 30 --p99-ms 50 --budget-s 600 --out tuned.yaml
    edge-vision serve --config tuned.yaml

It measures the engine alone first (if the load asks more frames a second than the engine
can serve, no setting helps, and it says so at once), then runs the real server against the
bench's simulated cameras sending real JPEGs, once with the settings the node runs anyway
(``engine.kind: auto``'s) and then with each knob worth searching on this machine's engine
(:mod:`.knobs`), keeping what serves the load best (:mod:`.search`). It writes a commented
YAML config, a report table and, where matplotlib is installed, a plot of every trial.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..args import add_config_args

DESCRIPTION = """Fit this machine to a stated load, by measuring it:

    edge-vision tune --cameras 16 --fps 30 --p99-ms 50 --budget-s 600 --out tuned.yaml
    edge-vision serve --config tuned.yaml

First the engine alone is measured: if the load asks more frames a second than it can
serve, no setting helps, and tune says so at once. Then the real server runs against
simulated cameras sending real JPEGs, with the settings the node runs anyway and then
with each setting worth searching for this machine's engine; the best that holds the load
(then the one that leaves the most CPU) is written as a commented config, with a report
of every trial beside it (OUT's name + -tune/)."""


def register_cli(sub: Any) -> None:
    """``edge-vision tune`` (picked up by :mod:`edge_vision.cli`)."""
    p = sub.add_parser(
        "tune",
        help="measure this machine and write the config that serves a stated load best",
        description=DESCRIPTION,
    )
    add_config_args(p)
    p.add_argument(
        "--cameras",
        type=int,
        help="cameras to serve (default: what the engine's measured ceiling holds at --fps, "
        "with a fifth to spare)",
    )
    p.add_argument(
        "--fps",
        type=float,
        help="frames a second per camera (default: 30, or the most one camera can have on an "
        "engine slower than that)",
    )
    p.add_argument(
        "--p99-ms",
        type=float,
        help="the latency every camera needs (default: 50, or three frames' time on an engine "
        "whose own frame takes longer than a third of that)",
    )
    p.add_argument(
        "--budget-s", type=float, default=600.0, help="how long the whole search may take"
    )
    p.add_argument("--trial-s", type=float, default=20.0, help="seconds of load in each trial")
    p.add_argument(
        "--input-sizes",
        help="also try these model input sizes, e.g. 640,480 (smaller is cheaper and finds "
        "small text less well, so it is only searched when asked)",
    )
    p.add_argument("--resolution", default="1280x720", help="frame size the cameras send")
    p.add_argument("--out", type=Path, default=Path("tuned.yaml"), help="the config to write")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from .run import tune

    return tune(args)
