"""What ``kubectl kustomize`` builds from deploy/k8s/, for tests (no cluster or kubectl here).

Covers what our kustomizations use: ``resources`` (files and base directories, resolved
recursively), ``patches`` by path (strategic merge: maps merge, lists of named items merge
by ``name``, other lists are replaced), ``images`` (newName/newTag) and
``configMapGenerator`` (files, which must exist). Anything else in a kustomization is
refused, so a feature the manifests start using cannot be silently ignored here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

Key = tuple[str, str]
KNOWN = {"apiVersion", "kind", "resources", "patches", "images", "configMapGenerator", "labels"}


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` onto ``base`` (the subset our patches need)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        merged = {item["name"]: item for item in base}
        for item in patch:
            name = item["name"]
            merged[name] = merge(merged[name], item) if name in merged else item
        return list(merged.values())
    return patch


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    found: list[dict[str, Any]] = spec.get("containers", []) + spec.get("initContainers", [])
    return found


def build(folder: Path) -> dict[Key, dict[str, Any]]:
    """The objects ``kubectl kustomize folder`` would output, by (kind, name)."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN
    if unknown:
        raise NotImplementedError(f"{folder}: kustomization fields not modelled: {unknown}")
    docs: dict[Key, dict[str, Any]] = {}

    def add(doc: dict[str, Any]) -> None:
        key = (doc["kind"], doc["metadata"]["name"])
        if key in docs:
            raise ValueError(f"{folder}: {key} defined twice (kustomize refuses this)")
        docs[key] = doc

    for resource in k.get("resources", []):
        path = folder / resource
        if path.is_dir():
            for doc in build(path).values():
                add(doc)
        else:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    add(doc)
    for patch in k.get("patches", []):
        for doc in yaml.safe_load_all((folder / patch["path"]).read_text()):
            key = (doc["kind"], doc["metadata"]["name"])
            if key not in docs:
                raise ValueError(f"{folder}: patch for {key}, which no resource defines")
            docs[key] = merge(docs[key], doc)
    for generator in k.get("configMapGenerator", []):
        data = {}
        for item in generator["files"]:
            name, _, rel = item.partition("=")
            data[name] = (folder / rel).read_text()  # raises if the file is missing
        add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]},
             "data": data})  # fmt: skip
    for image in k.get("images", []):
        for doc in docs.values():
            for c in _containers(doc):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    new_tag = image.get("newTag", tag)
                    c["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")
    return docs
