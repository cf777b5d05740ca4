"""The session settings' plain types, defined once (edge_vision.common.settings)."""

from __future__ import annotations

import pytest

from edge_vision.common.settings import MODES, is_mode

from ..support.imports import loaded_after_import

pytestmark = pytest.mark.timeout(60)


def test_the_modes_and_their_check() -> None:
    assert MODES == ("latest", "every")
    assert is_mode("latest") and is_mode("every")
    assert not is_mode("Latest") and not is_mode(None) and not is_mode(1)


def test_the_settings_types_cost_no_import() -> None:
    watched = ["edge_vision." + m for m in ("config", "receive", "pipeline", "session_core")]
    assert (
        loaded_after_import(["edge_vision.common.settings"], [*watched, "numpy", "pydantic"]) == []
    )


def test_the_session_and_reply_modules_load_no_frame_path() -> None:
    """Layering downwards: the session record and the reply serialiser use the plain
    settings and result types, not the pipeline (cv2, the engines, prometheus)."""
    watched = ["cv2", "prometheus_client", "pydantic"]
    watched += ["edge_vision." + m for m in ("pipeline", "engines", "metrics", "config")]
    assert (
        loaded_after_import(["edge_vision.session.record", "edge_vision.session.reply"], watched)
        == []
    )
