"""One-line messages from pydantic's validation errors: every bad field, dotted, with its
value, and none of pydantic's internals (a union member's tag, "Value error, ")."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

__all__ = ["format_validation_error"]


def format_validation_error(err: ValidationError, data: Any = None) -> str:
    """One line naming every bad field and its value (a union's tag left out of the path)."""
    lines = []
    for item in err.errors():
        parts = list(item["loc"])
        where = _algorithm_of(parts, data)
        tags = [p for p in parts if isinstance(p, str) and _UNION_TAG.match(p)]
        if tags and not _member_fits(tags[-1], item["input"]):
            continue  # a union member the value was never meant for (a range is not a list)
        parts = [p for p in parts if p not in tags]
        loc = ".".join(str(part) for part in parts)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown key{where} (value {_short(item['input'])})")
        elif loc and not isinstance(item["input"], dict):
            lines.append(f"{loc}: {message} (got {_short(item['input'])})")
        elif loc:
            lines.append(f"{loc}: {message}")
        else:
            lines.append(message)
    return "; ".join(lines)


def _algorithm_of(parts: list[Any], data: Any) -> str:
    """`` for algorithm 'grpo'`` when the error is inside an algorithm section of ``data``."""
    node = data
    for part in parts[:-1]:  # a field inside the section, not the section itself
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
        if part == "algorithm":
            name = node.get("name", "grpo") if isinstance(node, dict) else None
            return f" for algorithm {name!r}" if isinstance(name, str) else ""
    return ""


_UNION_TAG = re.compile(r"^(list|dict|str|int|float|bool)(\[.*\])?$|^function-(after|before|wrap|plain)\[")


def _member_fits(tag: str, value: Any) -> bool:
    """Whether a union member (pydantic's tag in an error's path) is meant for ``value``'s
    kind; a value of a kind no member takes is reported against every member."""
    kinds = {"list": list, "dict": dict, "str": str, "int": int, "float": float, "bool": bool}
    kind = kinds.get(tag.split("[")[0])
    if kind is None:  # a model behind a validator function: takes mappings
        kind = dict
    return isinstance(value, kind) or not isinstance(value, list | dict)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
