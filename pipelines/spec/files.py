"""Spec files, whatever their schema: YAML reading, dotted overrides, flattening, hashing.

``apply_overrides(data, ["trainer.lr=1e-4"])`` sets dotted keys in the raw mapping before
validation, so overrides are typed by the schema like the file itself.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

__all__ = ["SpecError", "apply_overrides", "flatten", "inapplicable", "read_yaml", "set_path", "spec_hash", "when"]


class SpecError(ValueError):
    """A spec that cannot run; the message names each bad field and its value."""


class _Section(BaseModel):
    """A spec section: unknown keys fail, assignments are validated, and no float may be
    infinite or NaN (an infinite learning rate or temperature trains nothing)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def set_path(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Set ``data[a][b] = value`` for ``key == "a.b"``, creating sections as needed; a
    number indexes a list (``rewards.0.weight``: the first reward term's weight)."""
    parts = key.strip().split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[:depth]) or "the spec"
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SpecError(f"{key}: {where} is a list of {len(node)}: {part!r} is not an index into it")
            if last:
                node[int(part)] = value
                return data
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise SpecError(f"{key}: {where!r} is not a section")
        if last:
            node[part] = value
            return data
        node = node.setdefault(part, {})
        if not isinstance(node, dict | list):
            raise SpecError(f"{key}: {'.'.join(parts[: depth + 1])!r} is not a section")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Set ``a.b=value`` overrides in a nested dict; values are parsed as YAML scalars."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"override {override!r} is not of the form key.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or " ".join(str(err).split())
            raise SpecError(f"override {override!r}: the value is not valid YAML ({problem})") from None
        try:
            set_path(data, key, value)
        except SpecError as err:
            raise SpecError(f"override {override!r}: {err}") from None
    return data


MAX_NODES = 100_000  # a spec expands to a few hundred; a "billion laughs" file to billions


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys and documents whose aliases expand past
    ``MAX_NODES`` nodes (measured on the composed graph, before anything is built)."""

    def construct_document(self, node: Any) -> Any:
        sizes: dict[int, int] = {}

        def expanded(n: Any) -> int:  # nodes once every alias is expanded, memoised per node
            if id(n) not in sizes:
                children = n.value if isinstance(n.value, list) else []
                flat = [c for item in children for c in (item if isinstance(item, tuple) else (item,))]
                sizes[id(n)] = min(MAX_NODES + 1, 1 + sum(expanded(c) for c in flat))
            return sizes[id(n)]

        if expanded(node) > MAX_NODES:
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_NODES} nodes: refused (an alias bomb?)")
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.YAMLError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML spec file; a SpecError naming the file for a missing,
    unreadable, empty, malformed file, duplicate keys, an alias bomb, or a non-mapping."""
    if path.is_dir():
        raise SpecError(f"spec file {str(path)!r} is a directory")
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: malformed YAML: {' '.join(str(err).split())[:500]}") from None
    if data is None:
        raise SpecError(f"{path}: the spec file is empty (no sections)")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def flatten(spec: BaseModel) -> dict[str, str]:
    """The resolved spec as dotted ``key: value`` strings (MLflow params)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), child)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for index, child in enumerate(value):
                walk(f"{prefix}.{index}", child)
        else:
            out[prefix] = json.dumps(value) if isinstance(value, list | type(None)) else str(value)

    walk("", spec.model_dump(mode="json"))
    return out


def when(**conditions: list[Any]) -> dict[str, Any]:
    """A field's ``json_schema_extra`` saying when it applies: ``when(kind=["decoded"])``
    (a field of its own section) or ``when(**{"orchestrator.mode": ["async"]})`` (a dotted
    path from the spec's root). Where it does not, it is left out of the run's params."""
    return {"when": conditions}


def inapplicable(spec: BaseModel) -> list[str]:
    """The flattened keys (or key prefixes) of fields whose :func:`when` does not hold."""
    out: list[str] = []

    def value_at(section: BaseModel, key: str) -> Any:
        target: Any = spec if "." in key else section
        for part in key.split("."):
            target = getattr(target, part)
        return target

    def walk(prefix: str, section: BaseModel) -> None:
        for name, field in type(section).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            conditions: dict[str, list[Any]] = extra.get("when", {})  # type: ignore[assignment]
            if any(value_at(section, key) not in allowed for key, allowed in conditions.items()):
                out.append(prefix + name)
                continue
            value = getattr(section, name)
            children = value if isinstance(value, list) else [value]
            for index, child in enumerate(children):
                if isinstance(child, BaseModel):
                    walk(f"{prefix}{name}.{index}." if isinstance(value, list) else f"{prefix}{name}.", child)

    walk("", spec)
    return out


def spec_hash(spec: BaseModel) -> str:
    """A stable short hash of the resolved spec."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]
