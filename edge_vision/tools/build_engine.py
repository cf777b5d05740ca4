"""``edge-vision build-engine [MODEL.onnx]``: build the TensorRT plan ``serve`` will use.

The plan lands in ``engine.tensorrt.engine_dir`` (``engines/`` by default) under a name
made from its key — model SHA-256, TensorRT version, GPU name and compute capability,
precision, optimisation profile, DLA core — with a JSON record beside it
(engines/README.md). ``serve`` with the same configuration finds it and never builds at
start; run this at install time (jetson/install.sh does) so the first start is fast.

Examples::

    edge-vision build-engine                                # embedded model, FP16
    edge-vision build-engine yolo11n.onnx --precision int8 --calibration site-frames/
    edge-vision build-engine --config /etc/edge-vision/config.yaml --dla-core 0
    edge-vision build-engine --read                         # and the text recogniser's

Settings come from the same config as ``serve`` (``--config``, ``EDGE_VISION_*``,
``--set``); the named flags below set the matching ``engine.tensorrt.*`` keys, and
``--set`` wins over them as it does for ``serve``. Running it again with nothing changed
prints the existing plan and exits; ``--force`` rebuilds.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

from ..config import Config, cli_overrides, load_config
from .args import setup_logging


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        type=Path,
        help="ONNX model (default: model.path from the config, else the embedded PP-OCRv6 "
        "text detector)",
    )
    p.add_argument("--config", type=Path, help="YAML config file, the one serve uses")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, e.g. --set engine.tensorrt.opt_batch=2 (repeatable)",
    )
    p.add_argument(
        "--precision", choices=["fp32", "fp16", "int8"], help="engine.tensorrt.precision"
    )
    p.add_argument(
        "--dla-core",
        type=int,
        metavar="N",
        help="build for Jetson DLA core N, GPU fallback on (needs static input sides: "
        "model.min_side == model.max_side)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="FOLDER_OR_VIDEO",
        help="INT8 calibration frames: an image folder or a video (engine.tensorrt."
        "calibration_source)",
    )
    p.add_argument("--calibration-frames", type=int, metavar="N", help="frames used for INT8")
    p.add_argument("--engine-dir", type=Path, help="where plans go (engine.tensorrt.engine_dir)")
    p.add_argument("--workspace-mib", type=int, metavar="MIB", help="builder workspace limit")
    p.add_argument(
        "--max-batch", type=int, metavar="N", help="profile's max batch (engine.max_batch)"
    )
    p.add_argument(
        "--force", action="store_true", help="rebuild even when a plan for the current key exists"
    )
    p.add_argument(
        "--read",
        action="store_true",
        help="also build the text recogniser's plan (read.*), which serve otherwise builds "
        "when the first session turns reading on, keeping that session waiting",
    )


def config_for_build(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    """The config ``serve`` would use, plus this command's flags (``--set`` wins)."""
    over = cli_overrides(args.set)
    named: dict[tuple[str, ...], Any] = {
        ("model", "path"): str(args.model) if args.model else None,
        ("engine", "max_batch"): args.max_batch,
        ("engine", "tensorrt", "precision"): args.precision,
        ("engine", "tensorrt", "dla_core"): args.dla_core,
        ("engine", "tensorrt", "calibration_source"): (
            str(args.calibration) if args.calibration else None
        ),
        ("engine", "tensorrt", "calibration_frames"): args.calibration_frames,
        ("engine", "tensorrt", "engine_dir"): str(args.engine_dir) if args.engine_dir else None,
        ("engine", "tensorrt", "workspace_mib"): args.workspace_mib,
    }
    for path, value in named.items():
        if value is None:
            continue
        node = over
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node.setdefault(path[-1], value)
    return load_config(args.config, environ=environ, cli=over)


class TqdmBuildProgress:
    """TensorRT ``IProgressMonitor`` phases as nested tqdm bars (one per open phase).

    TensorRT calls from its build threads; one lock keeps the bars consistent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bars: dict[str, Any] = {}

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        from tqdm import tqdm

        with self._lock:
            depth = len(self._bars)
            self._bars[phase] = tqdm(
                total=max(1, steps),
                desc=("  " * depth) + phase,
                position=depth,
                leave=depth == 0,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def step_complete(self, phase: str, step: int) -> bool:
        with self._lock:
            bar = self._bars.get(phase)
            if bar is not None:
                bar.update(step + 1 - bar.n)
        return True

    def phase_finish(self, phase: str) -> None:
        with self._lock:
            bar = self._bars.pop(phase, None)
            if bar is not None:
                bar.update(bar.total - bar.n)
                bar.close()


def cmd_build_engine(args: argparse.Namespace) -> int:
    config = config_for_build(args)
    from tqdm import tqdm

    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ..engines.tensorrt import build_for_config, profile_for, validate_build_settings
    from ..model.spec import decide_max_batch, load_model_spec

    setup_logging(config.logging.level)
    tcfg = config.engine.tensorrt
    # Refuse impossible settings before TensorRT and the GPU are even opened.
    validate_build_settings(tcfg.precision, tcfg.dla_core, tcfg.calibration_source)
    spec = load_model_spec(config.model)
    profile_for(spec.limits, decide_max_batch(spec, config.engine), tcfg)
    calibration_bar: Any = None

    def on_calibration_frames(n: int) -> None:
        nonlocal calibration_bar
        if calibration_bar is None:
            calibration_bar = tqdm(
                total=tcfg.calibration_frames,
                desc="INT8 calibration",
                unit="frame",
                file=sys.stderr,
            )
        calibration_bar.update(n)

    try:
        ready = build_for_config(
            spec,
            config,
            TqdmBuildProgress(),
            force=args.force,
            on_calibration_frames=on_calibration_frames,
        )
    finally:
        if calibration_bar is not None:
            calibration_bar.close()
    rec = ready.record
    json_path = ready.plan_path.with_suffix(".json")
    if ready.built:
        print(f"built {ready.plan_path} in {rec.build_seconds:.1f} s ({rec.plan_bytes} bytes)")
    else:
        print(f"up to date: {ready.plan_path} (built {rec.built_at}; --force rebuilds)")
    print(f"record: {json_path}")
    print(f"key: {ready.key.digest} ({ready.key.machine()}, {ready.key.precision})")
    gate = ready.int8_gate or rec.extra.get("int8_gate")  # INT8: the accuracy gate's figures
    if gate:
        print(gate["summary"])
    if args.read:
        from ..engines.tensorrt.recogniser import build_recogniser_for_config

        rec_ready = build_recogniser_for_config(config, TqdmBuildProgress(), force=args.force)
        r = rec_ready.record
        state = "built" if rec_ready.built else "up to date:"
        print(f"recogniser {state} {rec_ready.plan_path} ({r.build_seconds:.1f} s to build)")
    same = f" --config {args.config}" if args.config else ""
    print(f"serve with the same configuration uses it: edge-vision serve --engine tensorrt{same}")
    return 0


def register_cli(subparsers: Any) -> None:
    """``edge-vision build-engine`` (picked up by :mod:`edge_vision.cli`)."""
    p = subparsers.add_parser(
        "build-engine",
        help="build the TensorRT plan serve uses (FP16/INT8, profiles, DLA)",
        description="Build the TensorRT plan that serve --engine tensorrt uses, into "
        "engine.tensorrt.engine_dir, named by its key (model, TensorRT version, GPU, "
        "precision, profile, DLA core). Run it at install time so the first start is quick; "
        "serve finds the plan with the same configuration.",
    )
    add_arguments(p)
    p.set_defaults(func=cmd_build_engine)
