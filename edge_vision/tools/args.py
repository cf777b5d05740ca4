"""The flags every ``edge-vision`` command shares (``--config``, ``--model``, ``--engine``,
``--set``), the config they compose (file < environment < flags), and the log format."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..config import Config, cli_overrides, engine_kinds, load_config


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML config file (also EDGE_VISION_CONFIG)")
    p.add_argument("--model", type=Path, help="ONNX model (default: embedded PP-OCRv6 det)")
    p.add_argument("--engine", help=" | ".join(engine_kinds()) + " (engine.kind)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, e.g. --set engine.max_batch=8 (repeatable)",
    )


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Config:
    over = cli_overrides(args.set)
    named: dict[str, Any] = {"model": {}, "engine": {}, "server": {}}
    if getattr(args, "model", None):
        named["model"]["path"] = str(args.model)
    if getattr(args, "engine", None):
        named["engine"]["kind"] = args.engine
    if getattr(args, "host", None):
        named["server"]["host"] = args.host
    if getattr(args, "port", None) is not None:
        named["server"]["port"] = args.port
    for section, values in (extra or {}).items():
        named.setdefault(section, {}).update(values)
    for section, values in named.items():  # a named flag and --set: --set wins
        for k, v in values.items():
            over.setdefault(section, {}).setdefault(k, v)
    return load_config(args.config, cli=over)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
