"""What the micro-benchmarks that time one module against its older self share
(benchmarks.tracker, benchmarks.post): the module as it was at a git
revision, the versions to run, and the figures of one row."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


def load_baseline(rev: str, module: str) -> ModuleType:
    """``edge_vision/<module>.py`` (``module`` dotted below the package, e.g. ``model.heads``)
    as it was at git revision ``rev``, as a module of its package (its relative imports
    resolve against the current tree, so ``rev`` must have the module where it is today)."""
    root = Path(__file__).resolve().parents[1]
    path = f"edge_vision/{module.replace('.', '/')}.py"
    src = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    package, _, leaf = f"edge_vision.{module}".rpartition(".")
    name = f"{package}._{leaf}_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    loaded = importlib.util.module_from_spec(spec)
    loaded.__package__ = package
    sys.modules[name] = loaded  # dataclasses look their module up while being built
    exec(compile(src, f"{rev}:{path}", "exec"), loaded.__dict__)
    return loaded


def add_version_arguments(parser: argparse.ArgumentParser, module: str) -> None:
    """The options every such bench takes: rounds, the git revision to time beside the
    current ``edge_vision/<module>.py``, and a JSON file for the figures."""
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--baseline", metavar="REV", help=f"also time {module}.py of this git revision"
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")


def versions_to_run(current: ModuleType, module: str, rev: str | None) -> dict[str, ModuleType]:
    """``current`` as "current", and ``edge_vision/<module>.py`` at ``rev`` beside it."""
    versions = {"current": current}
    if rev:
        versions[rev] = load_baseline(rev, module)
    return versions


def timing_row(wall: list[float], cpu: list[float], count: str) -> dict[str, Any]:
    """Median and p90 of wall and thread-CPU milliseconds, and how many (``count``)."""
    return {
        "median_ms": float(np.median(wall)),
        "p90_ms": float(np.percentile(wall, 90)),
        "cpu_median_ms": float(np.median(cpu)),
        "cpu_p90_ms": float(np.percentile(cpu, 90)),
        count: len(wall),
    }


def timing_cells(row: dict[str, Any], versions: dict[str, ModuleType]) -> str:
    """One printed line's figures, version by version."""
    return "  ".join(
        f"{v}: wall median {row[v]['median_ms']:.3f} / p90 {row[v]['p90_ms']:.3f} ms,"
        f" CPU median {row[v]['cpu_median_ms']:.3f} / p90 {row[v]['cpu_p90_ms']:.3f} ms"
        for v in versions
    )
