"""The command line, as a user types it."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import edge_vision
from edge_vision.cli import build_parser
from edge_vision.config import ServerConfig

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "edge_vision", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_print_config_shows_the_effective_configuration() -> None:
    out = run(
        "serve",
        "--port",
        "9123",
        "--set",
        "engine.max_batch=8",
        "--print-config",
        env={"EDGE_VISION_SESSION__DEFAULT_MODE": "every"},
    )
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["server"]["port"] == 9123
    assert cfg["engine"]["max_batch"] == 8
    assert cfg["session"]["default_mode"] == "every"


def test_a_bad_key_stops_start_up_with_a_clear_message() -> None:
    out = run("serve", "--set", "engine.kind=openvino", "--print-config")
    assert out.returncode == 2
    assert "engine.kind" in out.stderr and "onnxruntime" in out.stderr
    assert "Traceback" not in out.stderr


def test_help_lists_the_subcommands() -> None:
    out = run("--help")
    assert out.returncode == 0 and "serve" in out.stdout


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


#: Every subcommand the command has (a new one is checked as soon as it registers).
SUBCOMMANDS = tuple(_subparsers())


def _description(help_text: str) -> str:
    """The paragraph(s) between the usage lines and the first list of arguments."""
    after_usage = help_text.split("\n\n", 1)[1]
    return after_usage.split("positional arguments:")[0].split("options:")[0].strip()


def test_version_is_the_packages_and_the_changelog_names_it() -> None:
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"edge-vision {edge_vision.__version__}"
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(edge_vision.__version__)}\b", changelog, re.M), (
        "CHANGELOG.md has no section for the version users see"
    )


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_explains_itself_without_markup(command: str) -> None:
    out = run(command, "--help")
    assert out.returncode == 0, out.stderr
    assert len(_description(out.stdout)) > 40, f"{command} --help has no description"
    assert "``" not in out.stdout  # reST quotes from docstrings, unreadable in a terminal


def test_every_option_of_every_subcommand_has_help() -> None:
    subparsers = _subparsers()
    assert {"serve", "replay", "bench", "build-engine", "token", "doctor"} <= set(subparsers)
    for name, p in subparsers.items():
        bare = [a.dest for a in p._actions if a.option_strings and not (a.help or "").strip()]
        assert not bare, f"{name}: options without help: {bare}"


def test_serve_help_says_where_it_listens_by_default() -> None:
    out = run("serve", "--help").stdout
    flat = " ".join(out.split())  # argparse wraps lines where it likes
    port = ServerConfig.model_fields["port"].default
    assert (
        "--host HOST listen address (server.host; default: 127.0.0.1, this machine only, "
        "while auth is off; 0.0.0.0 with auth on)"
    ) in flat
    assert f"--port PORT listen port (server.port; default: {port})" in flat


def test_defaults_are_shown_beside_the_options() -> None:
    flat = " ".join(run("bench", "--help").stdout.split())
    assert "--fps FPS frames per second per camera (default: 15.0)" in flat
    assert "--mode {latest,every}" in flat and "(default: latest)" in flat
    flat = " ".join(run("replay", "--help").stdout.split())
    assert "--jpeg-quality JPEG_QUALITY JPEG quality sent (default: 90)" in flat
    assert "(default: None)" not in flat and "(default: False)" not in flat


def test_token_help_lists_only_its_own_options() -> None:
    out = run("token", "--help").stdout
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out))
    assert {"--config", "--set", "--subject", "--ttl", "--scope", "--new-secret"} <= options
    assert not options & {"--model", "--engine"}, options
