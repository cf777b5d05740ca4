"""The session settings' plain types, defined once (edge_vision.settings)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_vision.settings import MODES, is_mode

pytestmark = pytest.mark.timeout(60)


def test_the_modes_and_their_check() -> None:
    assert MODES == ("latest", "every")
    assert is_mode("latest") and is_mode("every")
    assert not is_mode("Latest") and not is_mode(None) and not is_mode(1)


def test_the_settings_types_cost_no_import() -> None:
    code = (
        "import sys, edge_vision.settings; "
        "print(sorted(m for m in sys.modules if m.startswith('edge_vision')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=50
    )
    assert out.stdout.strip() == "['edge_vision', 'edge_vision.settings']"
