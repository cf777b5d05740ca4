"""Configuration: YAML < environment < CLI, validated with messages naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_vision.config import cli_overrides, dump_config, load_config
from edge_vision.errors import ConfigError


def test_precedence_yaml_then_env_then_cli(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 7000\n  host: 10.0.0.1\nengine:\n  max_batch: 2\n")
    env = {"EDGE_VISION_SERVER__PORT": "7100", "EDGE_VISION_ENGINE__MAX_BATCH": "3"}
    cfg = load_config(f, environ=env, cli=cli_overrides(["engine.max_batch=6"]))
    assert cfg.server.port == 7100 and cfg.server.host == "10.0.0.1"
    assert cfg.engine.max_batch == 6


def test_env_values_get_their_natural_types() -> None:
    cfg = load_config(
        None,
        environ={
            "EDGE_VISION_MODEL__LABELS": "[a, b]",
            "EDGE_VISION_DECODE__DCT_DOWNSCALE": "false",
        },
    )
    assert cfg.model.labels == ["a", "b"] and cfg.decode.dct_downscale is False


def test_config_file_from_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("session:\n  default_mode: every\n")
    assert load_config(None, environ={"EDGE_VISION_CONFIG": str(f)}).session.default_mode == "every"


def test_unknown_key_is_named_with_the_allowed_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={}, cli=cli_overrides(["server.prot=1"]))
    assert "server.prot" in str(info.value) and "port" in str(info.value)


def test_bad_value_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"EDGE_VISION_ENGINE__KIND": "openvino"})
    msg = str(info.value)
    assert "engine.kind" in msg and "onnxruntime" in msg and "openvino" in msg


def test_unknown_env_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'gpu'"):
        load_config(None, environ={"EDGE_VISION_GPU": "1"})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("server: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, environ={}, cli=cli_overrides(["server.port=9001"]))
    f = tmp_path / "dump.yaml"
    f.write_text(dump_config(cfg))
    assert load_config(f, environ={}) == cfg


def test_torch_compile_takes_yaml_s_bare_off_and_on() -> None:
    """`--set engine.torch.compile=off` reaches the config as YAML's boolean false: it
    means off (and a bare on, inductor's default mode), not a validation error."""
    from ..support.server import make_config

    assert make_config({"engine": {"torch": {"compile": False}}}).engine.torch.compile == "off"
    assert make_config({"engine": {"torch": {"compile": True}}}).engine.torch.compile == "default"
    assert make_config({"engine": {"torch": {"compile": "max-autotune"}}}).engine.torch.compile == (
        "max-autotune"
    )


def test_an_old_config_with_a_removed_key_starts_and_says_what_to_delete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="edge_vision.config"):
        config = load_config(
            environ={"EDGE_VISION_SERVER__GIL_SWITCH_MS": "1"},
            cli={
                "engine": {"cuda_sync": "blocking", "max_batch": 2},
                "decode": {"device_wait": "stream"},
            },
        )
    assert config.engine.max_batch == 2
    assert not hasattr(config.decode, "device_wait")
    said = [r.getMessage() for r in caplog.records]
    assert any("'engine.cuda_sync' is no longer used" in m and "delete it" in m for m in said)
    assert any("'server.gil_switch_ms' is no longer used" in m for m in said)
    assert any("'decode.device_wait' is no longer used" in m for m in said)
    with pytest.raises(ConfigError, match=r"unknown config key 'engine\.cuda_synk'"):
        load_config(environ={}, cli={"engine": {"cuda_synk": "blocking"}})
