"""All configuration: the sections, one module per part of the service (``serve``, ``model``,
``engines``, ``frames``, ``session``, ``events``), composed into :class:`Config` and loaded
here.

Sources, lowest precedence first:

1. the defaults the sections declare;
2. a YAML file (``--config FILE`` or ``EDGE_VISION_CONFIG=FILE``);
3. environment variables ``EDGE_VISION_<SECTION>__<KEY>`` (``EDGE_VISION_SERVER__PORT=9000``,
   nested deeper with more ``__``); values are read as YAML scalars, so ``true``, ``12`` and
   ``[0, 2]`` have their types;
4. CLI flags: the named ones (``--port 9000``) and ``--set section.key=value``.

Every key is validated at start; an unknown key or a bad value stops start-up with a
:class:`~edge_vision.errors.ConfigError` that names the key and the allowed values.
``edge-vision serve --print-config`` prints the effective result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from ..errors import ConfigError
from .base import ENV_CONFIG_FILE, ENV_PREFIX, ENV_TOKEN_SECRET, _Section
from .engines import (
    EngineConfig,
    EngineSection,
    OnnxRuntimeConfig,
    TensorRTConfig,
    TorchConfig,
    TritonConfig,
    engine_kinds,
    engine_sections,
)
from .events import EventsConfig, RuleConfig, SessionEventsSettings
from .frames import DecodeConfig, ReadConfig
from .model import DbnetConfig, ModelConfig
from .serve import ApiKeyConfig, AuthConfig, LimitsConfig, LoggingConfig, ServerConfig
from .session import SessionConfig, StateConfig

log = logging.getLogger(__name__)

__all__ = [
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "ENV_TOKEN_SECRET",
    "ApiKeyConfig",
    "AuthConfig",
    "Config",
    "DbnetConfig",
    "DecodeConfig",
    "EngineConfig",
    "EngineSection",
    "EventsConfig",
    "LimitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "OnnxRuntimeConfig",
    "ReadConfig",
    "RuleConfig",
    "ServerConfig",
    "SessionConfig",
    "SessionEventsSettings",
    "StateConfig",
    "TensorRTConfig",
    "TorchConfig",
    "TritonConfig",
    "cli_overrides",
    "dump_config",
    "engine_kinds",
    "engine_sections",
    "env_overrides",
    "load_config",
    "session_input_sizes",
]


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    read: ReadConfig = Field(default_factory=ReadConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    #: How ``engine.kind: auto`` was resolved on this machine (edge_vision/engines/choice.py):
    #: kind, reason and the values it derived; None while unresolved or when set by hand.
    _engine_choice: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _listen_where_auth_allows(self) -> Config:
        """An unset ``server.host``: this machine only while auth is off (a demo is not
        on the network), every interface with auth on (docs/security.md)."""
        if self.server.host is None:
            self.server.host = "0.0.0.0" if self.auth.enabled else "127.0.0.1"
        return self


# ---------------------------------------------------------------------------------------
# Loading


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(e["loc"]))
            lines.append(f"unknown config key '{key}'; allowed keys here: {allowed}")
        else:
            lines.append(f"config key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"empty config key in {dotted!r}")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{dotted}': '{p}' is not a section")
        node = child
    node[parts[-1]] = value


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _scalar(text: str) -> Any:
    """A value given as text (env var or --set) read as YAML, so it gets its natural type."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``EDGE_VISION_SECTION__KEY=value`` entries as a nested dict."""
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in (ENV_CONFIG_FILE, ENV_TOKEN_SECRET):
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        _set_path(tree, dotted, _scalar(value))
    return tree


def cli_overrides(assignments: list[str]) -> dict[str, Any]:
    """``section.key=value`` strings (from ``--set``) as a nested dict."""
    tree: dict[str, Any] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        _set_path(tree, key.strip(), _scalar(value))
    return tree


#: Keys that earlier releases had and this one ignores, with why and what to do: an old
#: config still starts, and says so once (removed for good in the next release).
REMOVED_KEYS: dict[str, str] = {
    "engine.cuda_sync": "how threads wait for the GPU made no measured difference "
    "(docs/benchmarks.md, 'the same-run before/after and the push')",
    "server.gil_switch_ms": "a shorter GIL switch interval answered no more frames "
    "(docs/benchmarks.md, 'what holds 64 cameras back, and the final before/after')",
    "decode.device_wait": "the engine's stream waiting for each decoded canvas answered no "
    "more frames and took more server CPU a frame than the decode thread waiting "
    "(docs/benchmarks.md, 'MPS, eight workers and the stream hand-off')",
}


def _drop_removed(tree: dict[str, Any]) -> None:
    """Take the :data:`REMOVED_KEYS` out of ``tree``, warning once for each found."""
    for dotted, why in REMOVED_KEYS.items():
        section, _, key = dotted.partition(".")
        values = tree.get(section)
        if isinstance(values, dict) and key in values:
            del values[key]
            log.warning(
                "config key '%s' is no longer used (%s): delete it from your config", dotted, why
            )


def load_config(
    file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective configuration: defaults < YAML file < environment < CLI."""
    environ = os.environ if environ is None else environ
    file = file or environ.get(ENV_CONFIG_FILE) or None
    tree: dict[str, Any] = {}
    if file is not None:
        path = Path(file)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        tree = loaded
    tree = _merge(tree, env_overrides(environ))
    tree = _merge(tree, dict(cli or {}))
    _drop_removed(tree)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None


def session_input_sizes(config: Config) -> list[int]:
    """The input sizes a session may choose (``model.input_sizes``, with the configured
    ``model.input_size`` always among them) that the configured engine can run."""
    m = config.model
    top = m.input_size if config.engine.kind == "tensorrt" else m.max_side
    return sorted({s for s in m.input_sizes if 32 <= s <= top} | {m.input_size})


def dump_config(config: Config) -> str:
    """The effective configuration as YAML (what ``--print-config`` shows)."""
    data = config.model_dump(mode="json")
    return str(yaml.safe_dump(data, sort_keys=False))
