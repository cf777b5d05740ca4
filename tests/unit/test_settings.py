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


def test_the_session_and_reply_modules_load_no_frame_path() -> None:
    """Layering downwards: the session record and the reply serialiser use the plain
    settings and result types, not the pipeline (cv2, the engines, prometheus)."""
    code = (
        "import sys, edge_vision.session, edge_vision.reply; "
        "print(sorted(m for m in ('cv2', 'prometheus_client', 'pydantic', 'edge_vision.pipeline',"
        " 'edge_vision.engines', 'edge_vision.metrics', 'edge_vision.config') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=50
    )
    assert out.stdout.strip() == "[]"
