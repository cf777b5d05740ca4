"""What importing a module costs: which modules a fresh interpreter has loaded after it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable


def loaded_after_import(imports: Iterable[str], watched: Iterable[str]) -> list[str]:
    """The ``watched`` modules (sorted) that a new Python process has in ``sys.modules``
    after importing ``imports``; a fresh process, since this one has imported much more."""
    code = (
        f"import sys, {', '.join(imports)}; "
        f"print('\\n'.join(sorted(m for m in {sorted(watched)!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=50
    )
    return out.stdout.split()
