"""``edge-vision doctor``: what this board can do, checked on the board itself.

The project is built and tested on machines without a Jetson and without TensorRT, so a
user's first run on their own board is where those parts meet real hardware. ``doctor``
checks what the tests here could not and prints a short pass/fail table; ``--json FILE``
writes the same as a report to attach to an issue (docs/jetson.md says what to send).

Checks, in order: the platform; JetPack / L4T (``/etc/nv_tegra_release``,
``/proc/device-tree/model``); CUDA (driver, runtime, GPU, multiprocessors); each CUDA layer
(:mod:`edge_vision.engines.cuda`: cuda-python, pycuda) and the one in use; TensorRT and the DLA
cores; the JPEG decoder in use (host, and the GPU decoder when ``decode.device`` allows);
whether a TensorRT plan for this board exists and matches its key (``--build`` builds a
small one, with the INT8 accuracy gate when the precision is int8); ONNX Runtime on the
CPU on a real frame; the GPU engine (configured, or TensorRT / torch on CUDA when
present, once per CUDA layer) on the same frame against ONNX Runtime — relative error of
the raw output (the probability map) and the agreement of the detections
(:mod:`edge_vision.common.agreement`); single-frame latency and batch throughput.

A check that cannot run says ``not available: <reason>``; one that breaks says ``fail``
with the error's message; none prints a traceback. The exit code is 0 when nothing
failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ... import __version__
from ...config import Config
from ...engines.choice import engine_choice_of
from ..args import add_config_args, config_from_args, setup_logging
from .checks import Doctor, DoctorOptions
from .probes import (
    FAIL,
    INFO,
    NA,
    PASS,
    Check,
    compare_with_reference,
    jetpack_for_l4t,
    mps_pipe_dir,
    parse_l4t_release,
    relative_error,
)

__all__ = [
    "FAIL",
    "INFO",
    "NA",
    "PASS",
    "Check",
    "Doctor",
    "DoctorOptions",
    "cmd_doctor",
    "compare_with_reference",
    "jetpack_for_l4t",
    "mps_pipe_dir",
    "parse_l4t_release",
    "register_cli",
    "relative_error",
    "report",
    "summary_table",
]


# -- report -----------------------------------------------------------------------------


def summary_table(checks: Sequence[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, NA, INFO)}
    verdict = "FAILED" if counts[FAIL] else "OK"
    lines = ["", f"{'check':<34} result", "-" * 48]
    lines += [f"{c.name:<34} {c.status}" for c in checks]
    lines.append("-" * 48)
    lines.append(
        f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
        f"{counts[NA]} not available, {counts[INFO]} info"
    )
    return "\n".join(lines)


def report(checks: Sequence[Check], config: Config) -> dict[str, Any]:
    return {
        "tool": "edge-vision doctor",
        "edge_vision": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "engine_configured": config.engine.kind,
        "engine_choice": engine_choice_of(config),
        "checks": [asdict(c) for c in checks],
        "failed": [c.name for c in checks if c.status == FAIL],
        "not_available": [c.name for c in checks if c.status == NA],
    }


def cmd_doctor(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging("WARNING" if not args.verbose else "INFO")
    options = DoctorOptions(
        build=args.build,
        image=args.image,
        seconds=args.seconds,
        engine=args.engine,
        latency=not args.skip_latency,
    )
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...serve.auth import redact_text, redact_values

    # What it prints and writes holds no secret: server.admin_token by value, the rest by
    # form (a URL's password, tokens, keys; serve/auth.py).
    redact_values([config.server.admin_token])
    doctor = Doctor(config, options, out=lambda line: print(redact_text(line), flush=True))
    checks = doctor.run()
    print(redact_text(summary_table(checks)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = redact_text(json.dumps(report(checks, doctor.config), indent=2, default=str))
        args.json.write_text(body + "\n")
        print(f"report: {args.json}")
    return 1 if any(c.status == FAIL for c in checks) else 0


def register_cli(subparsers: Any) -> None:
    """``edge-vision doctor`` (picked up by :mod:`edge_vision.cli`)."""
    p = subparsers.add_parser(
        "doctor",
        help="check this board: JetPack, CUDA, TensorRT, engines against ONNX Runtime",
        description="Check what this board can do, on the board itself: platform, JetPack, "
        "CUDA and its layers, TensorRT and DLA cores, the JPEG decoder, the configured engine "
        "against ONNX Runtime on a real frame, latency and throughput. Prints a pass/fail "
        "table; --json FILE writes a report to attach to an issue (docs/jetson.md).",
    )
    add_config_args(p)  # --config, --model, --engine (the engine to test), --set
    p.add_argument("--build", action="store_true", help="build a small TensorRT plan now")
    p.add_argument("--image", type=Path, help="the real frame to run (default: a generated one)")
    p.add_argument(
        "--seconds", type=float, default=3.0, help="time per latency/throughput measurement"
    )
    p.add_argument("--skip-latency", action="store_true", help="no latency/throughput runs")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report here")
    p.add_argument("--verbose", action="store_true", help="log at INFO")
    p.set_defaults(func=cmd_doctor)
