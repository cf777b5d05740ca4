"""``edge-vision bench``: load tests that measure what a camera client sees (the usage is
:data:`.command.DESCRIPTION`)."""

from __future__ import annotations

from typing import Any


def register_cli(sub: Any) -> None:
    """Register ``bench`` (the command module, and the CLI it needs, load on demand, so
    camera processes that import this package stay light and free of import cycles)."""
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from .command import register

    register(sub)
