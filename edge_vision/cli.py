"""The ``edge-vision`` command: ``serve``, ``replay``, ``bench``, ``build-engine``, ``token``,
``doctor``; ``--version``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .config import ServerConfig, dump_config
from .errors import EdgeVisionError
from .tools.args import CommandParser, add_config_args, config_from_args, setup_logging

log = logging.getLogger("edge_vision")


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging(config.logging.level)
    # The engine choice and the server's imports (~1 s) only when serving, not for --help.
    from .engines.choice import describe_choice, resolve_engine
    from .serve.auth import redact_text, redact_values
    from .serve.workers import run_node

    config = resolve_engine(config)  # engine.kind auto: said once the port is bound
    if args.print_config:
        log.info(describe_choice(config))
        # Secrets shown as REDACTED: server.admin_token by value, a URL's password by form.
        redact_values([config.server.admin_token])
        sys.stdout.write(redact_text(dump_config(config)))
        return 0
    run_node(config)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="edge-vision",
        description="Real-time computer vision over one WebSocket: camera frames in, boxes "
        "(and the text in them) out. 'edge-vision COMMAND --help' tells more of each command.",
    )
    parser.add_argument("--version", action="version", version=f"edge-vision {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the WebSocket service and the overlay page",
        description="Run the service: the WebSocket protocol at /ws, the overlay page at /, "
        "/healthz, /readyz and /metrics. Settings come from the defaults, --config FILE, "
        "EDGE_VISION_<SECTION>__<KEY> variables and the flags, in that order; "
        "--print-config shows the result.",
    )
    add_config_args(serve)
    defaults = ServerConfig.model_fields
    serve.add_argument(
        "--host",
        help="listen address (server.host; default: 127.0.0.1, this machine only, while auth "
        "is off; 0.0.0.0 with auth on)",
    )
    serve.add_argument(
        "--port", type=int, help=f"listen port (server.port; default: {defaults['port'].default})"
    )
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
    "tools.token",
    "tools.doctor",
    "tools.tune",
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
