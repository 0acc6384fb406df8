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

__all__ = ["SpecError", "apply_overrides", "flatten", "read_yaml", "set_path", "spec_hash"]


class SpecError(ValueError):
    """A spec that cannot run; the message names each bad field and its value."""


class _Section(BaseModel):
    """A spec section: unknown keys fail, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def set_path(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Set ``data[a][b] = value`` for ``key == "a.b"``, creating sections as needed."""
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"{key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value
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
            raise SpecError(f"override {override!r}: value is not valid YAML: {err}") from err
        try:
            set_path(data, key, value)
        except SpecError as err:
            raise SpecError(f"override {override!r}: {err}") from None
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from err
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


def spec_hash(spec: BaseModel) -> str:
    """A stable short hash of the resolved spec."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]
