"""systemd units checked by systemd itself (``systemd-analyze verify``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def verify_unit(unit_text: str, folder: Path, name: str) -> subprocess.CompletedProcess[str]:
    """Write ``unit_text`` to ``folder/name`` and run ``systemd-analyze verify`` on it
    (verify also checks that every Exec program exists: callers point them at programs
    this machine has)."""
    copy = folder / name
    copy.write_text(unit_text)
    return subprocess.run(
        ["systemd-analyze", "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
    )
