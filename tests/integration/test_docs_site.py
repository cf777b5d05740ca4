"""The documentation site as a reader sees it: `mkdocs build --strict` (the `docs` extra) of
this tree, then the built pages read back. scripts/test builds it too; here the pages' content
is checked: the configuration reference made from the code has every setting, the client's
API reference has its methods without Sphinx markup, and the raw benchmark data are no pages.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from edge_vision.config import Config

from ..support.timing import T

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings", reason="the docs extra: pip install -e '.[docs]'")

REPO = Path(__file__).resolve().parents[2]


def _text(page: Path) -> str:
    """A built page's words, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every settable key of the config, dotted, with its description."""
    keys: dict[str, str] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        dotted = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _leaf_keys(ann, dotted + ".")
        else:
            keys[dotted] = field.description or ""
    return keys


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=T(120),
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_configuration_page_lists_every_setting_with_its_description(site: Path) -> None:
    text = " ".join(_text(site / "configuration" / "index.html").split())
    keys = _leaf_keys(Config)
    assert len(keys) > 50  # the walk found the sections
    missing = [k for k in keys if k not in text]
    assert not missing, f"settings missing from the configuration page: {missing}"
    undescribed = [k for k, d in keys.items() if " ".join(d.split())[:60] not in text]
    assert not undescribed, f"descriptions missing from the page: {undescribed}"
    assert "EDGE_VISION_SERVER__PORT" in text


def test_the_client_api_reference_shows_its_methods_in_plain_markdown(site: Path) -> None:
    text = _text(site / "client-api" / "index.html")
    for name in ("EdgeVisionClient", "detect", "send", "settings", "results", "Hello"):
        assert re.search(rf"\b{name}\b", text), name
    assert ":class:" not in text and ":meth:" not in text and "``" not in text


def test_raw_benchmark_data_are_not_pages(site: Path) -> None:
    assert (site / "benchmarks" / "index.html").is_file()
    assert not (site / "bench-data").exists()
    assert not (site / "hooks.py").exists()
