"""The lab's benchmarks (``benchmarks/``) run tiny, as a user runs them: a process of
their own, their report read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def small_bench(
    module: str, *args: str, json_out: Path | None, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m benchmarks.MODULE ARGS [--json JSON_OUT]``: the finished process
    and, when it succeeded with ``json_out``, its report."""
    extra = ("--json", str(json_out)) if json_out is not None else ()
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode == 0 and json_out is not None:
        return proc, json.loads(json_out.read_text())
    return proc, {}
