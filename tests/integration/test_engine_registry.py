"""Declare, then derive: an engine kind is its config section (config.EngineSection, with
its install hint) plus an Engine subclass in ``edge_vision.engines.<kind>``; the values
``engine.kind`` accepts, the lookup, the CLI help and the engine metrics follow."""

from __future__ import annotations

import sys

import pytest

from edge_vision.cli import main
from edge_vision.common.metrics import Metrics
from edge_vision.config import engine_kinds, engine_sections, load_config
from edge_vision.engines import Engine, create_engine, engine_class
from edge_vision.errors import ConfigError, EngineError
from edge_vision.model.spec import ModelSpec

from ..support.imports import loaded_after_import
from ..support.server import make_config

pytestmark = pytest.mark.timeout(60)

KINDS = ("onnxruntime", "torch", "tensorrt", "triton")


def test_the_kinds_are_the_engine_sections_of_the_config() -> None:
    assert engine_kinds() == KINDS
    config = make_config()
    for kind, section in engine_sections().items():
        assert isinstance(getattr(config.engine, kind), section)
        assert section.install  # what to pip install when the backend is missing


def test_each_kind_finds_the_engine_of_its_module() -> None:
    for kind in engine_kinds():
        cls = engine_class(kind)
        assert issubclass(cls, Engine) and cls.kind == kind
        assert cls.__module__.startswith(f"edge_vision.engines.{kind}")


def test_an_unknown_kind_is_refused_at_start_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, environ={}, cli={"engine": {"kind": "openvino"}})
    known = "known: auto, onnxruntime, torch, tensorrt, triton"
    assert f"unknown engine 'openvino'; {known}" in str(err.value)
    with pytest.raises(EngineError, match="unknown engine 'openvino'"):
        engine_class("openvino")


def test_an_absent_backend_library_names_what_to_install(
    spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as it does where tritonclient is absent.
    monkeypatch.setitem(sys.modules, "edge_vision.engines.triton", None)
    with pytest.raises(EngineError, match=r"pip install tritonclient\[grpc\]"):
        create_engine("triton", spec, make_config({"engine": {"kind": "triton"}}))


def test_the_cli_help_lists_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "auto | onnxruntime | torch | tensorrt | triton (engine.kind; default: auto)" in help_text
    )


def test_the_engine_active_series_has_every_kind() -> None:
    metrics = Metrics(engine_kinds())
    metrics.set_engine("tensorrt", degraded=False, max_batch=8)
    text = metrics.render().decode()
    for kind in KINDS:
        value = 1.0 if kind == "tensorrt" else 0.0
        assert f'edge_vision_engine_active{{kind="{kind}"}} {value}' in text


def test_importing_the_service_imports_no_optional_backend() -> None:
    imports = ["edge_vision.serve.server", "edge_vision.cli", "edge_vision.engines"]
    assert loaded_after_import(imports, ["torch", "tensorrt", "tritonclient", "grpc"]) == []
