"""The command line, as a user types it."""

from __future__ import annotations

import subprocess
import sys

import yaml


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
