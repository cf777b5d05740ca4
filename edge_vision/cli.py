"""The ``edge-vision`` command: ``serve``, ``replay``, ``bench``, ``build-engine``, ``token``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import Config, cli_overrides, dump_config, engine_kinds, load_config
from .errors import EdgeVisionError

log = logging.getLogger("edge_vision")


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


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.print_config:
        sys.stdout.write(dump_config(config))
        return 0
    setup_logging(config.logging.level)
    from .serve.server import run_server

    run_server(config)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-vision", description="Real-time computer-vision WebSocket service."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the WebSocket service")
    add_config_args(serve)
    serve.add_argument("--host", help="listen address (server.host)")
    serve.add_argument("--port", type=int, help="listen port (server.port)")
    serve.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    serve.set_defaults(func=cmd_serve)

    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"edge_vision.{name}").register_cli(sub)
    return parser


# Subcommands that live in their own modules; each has ``register_cli(subparsers)`` and
# keeps its heavy imports inside the command function. Imported when the parser is built:
# they import this module for the shared config flags.
SUBCOMMAND_MODULES = (
    "tools.replay",
    "tools.bench",
    "tools.build_engine",
    "serve.auth",
    "tools.doctor",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except EdgeVisionError as e:
        print(f"edge-vision: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
