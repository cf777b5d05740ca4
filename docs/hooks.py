"""MkDocs hooks (mkdocs.yml ``hooks:``) and a griffe extension for the API reference.

- ``on_page_markdown``: a page that holds the line ``<!-- settings-reference -->`` gets,
  in its place, one table per config section, read from the settings' own pydantic
  models (``edge_vision.config``): key, type, default, environment variable and the
  field's ``description``. The page is made at build time, so it cannot drift from the
  code.
- :class:`ReSTQuotes`: the package's docstrings are written for a terminal and Sphinx
  (double-backquoted code, ``:class:`` roles, ``::`` literal blocks); this turns them into
  the Markdown that mkdocstrings renders.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import griffe
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# mkdocs loads this file by path: make the checkout's package importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_vision.config import ENV_PREFIX, Config  # noqa: E402

MARKER = "<!-- settings-reference -->"


# ---------------------------------------------------------------------------------------
# The configuration reference


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _type_name(annotation: Any) -> str:
    """A type as a user writes the value: ``a | b`` for a Literal, ``int``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        return {"Path": "path"}.get(annotation.__name__, annotation.__name__)
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, Path):
        value = str(value)
    elif isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value, default=str)
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _sections(model: type[BaseModel], prefix: str) -> list[tuple[str, type[BaseModel]]]:
    """``model`` and every section inside it, depth first, each with its dotted key."""
    found = [(prefix, model)]
    for name, field in model.model_fields.items():
        if _is_section(field.annotation):
            found += _sections(field.annotation, f"{prefix}.{name}" if prefix else name)
    return found


def settings_reference(root: type[BaseModel] = Config) -> str:
    """One Markdown table per section of ``root`` (the top level itself holds sections)."""
    out: list[str] = []
    for key, section in _sections(root, ""):
        rows = [
            (name, field)
            for name, field in section.model_fields.items()
            if not _is_section(field.annotation)
        ]
        if not key or not rows:
            continue
        out.append(f"### `{key}`\n")
        doc = (section.__doc__ or "").strip()
        if doc and not doc.startswith("Usage docs:"):  # pydantic's own docstring
            out.append(_cell(doc) + "\n")
        out.append("| key | type | default | what it does |")
        out.append("| --- | --- | --- | --- |")
        for name, field in rows:
            dotted = f"{key}.{name}"
            env = ENV_PREFIX + "__".join(dotted.upper().split("."))
            what = _cell(field.description or "")
            out.append(
                f"| `{dotted}` | {_type_name(field.annotation)} | {_default(field)} | "
                f"{what}<br><small>`{env}`</small> |"
            )
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, settings_reference())
    return markdown


# ---------------------------------------------------------------------------------------
# Docstrings for mkdocstrings

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):`~?\.?([^`]+)`")


def rest_to_markdown(text: str) -> str:
    """Sphinx roles and double backquotes as Markdown code; ``::`` blocks as code blocks."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    text = text.replace("``", "`")
    text = re.sub(r"^::\n", "\n", text, flags=re.M)  # "::" alone: the block follows
    return re.sub(r"(\S)::\n", r"\1:\n", text)  # "text::": a colon, the block follows


class ReSTQuotes(griffe.Extension):
    """Rewrites each docstring with :func:`rest_to_markdown` as griffe loads it."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
