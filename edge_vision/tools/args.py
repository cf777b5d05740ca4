"""What every ``edge-vision`` command shares: the config flags (``--config`` and ``--set``
for all; ``--model`` and ``--engine`` for those that run the model), the config they
compose (file < environment < flags), how help is shown, and the log format."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..config import Config, EngineConfig, cli_overrides, engine_kinds, load_config


class HelpFormatter(argparse.HelpFormatter):
    """Help as a user reads it in a terminal: each option's default is shown (unless it has
    none, or its help already says it in words); a description's paragraphs are wrapped,
    but an indented block (examples) keeps its lines; the docstrings' reST quotes
    (double backquotes) are dropped."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = (action.help or "").replace("``", "")
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or "%(default)" in text
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.replace("``", "").strip("\n").split("\n\n")
        filled = [
            textwrap.indent(para, indent)
            if any(line.startswith(" ") for line in para.splitlines())
            else super(HelpFormatter, self)._fill_text(para, width, indent)
            for para in paragraphs
        ]
        return "\n\n".join(filled)


class CommandParser(argparse.ArgumentParser):
    """The ``edge-vision`` parser; its subcommands' parsers are of this class too, so every
    one shows its help through :class:`HelpFormatter`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kwargs)


def add_config_file_args(p: argparse.ArgumentParser) -> None:
    """``--config`` and ``--set``: for a command that reads the config but runs no model."""
    p.add_argument("--config", type=Path, help="YAML config file (also EDGE_VISION_CONFIG)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, e.g. --set engine.max_batch=8 (repeatable)",
    )


def add_config_args(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--set``, ``--model`` and ``--engine``: for a command that runs the model."""
    add_config_file_args(p)
    p.add_argument("--model", type=Path, help="ONNX model (default: the embedded PP-OCRv6 det)")
    p.add_argument(
        "--engine",
        help=" | ".join(("auto", *engine_kinds()))
        + f" (engine.kind; default: {EngineConfig.model_fields['kind'].default})",
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
