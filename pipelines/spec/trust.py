"""Code a spec would run is opt-in, as ``trust_remote_code`` is in Hugging Face.

Built-in names (a registered loss, estimator or reward kind, the package's own scorers)
need nothing. A spec that would import code — a ``plugins`` entry (a module or a ``.py``
file), a reward ``kind`` or decoded ``scorer`` given as ``module:function`` outside
``asyncrlhf``, a model folder whose ``config.json`` names custom code (``auto_map``) — is
refused in one line naming each of them, unless the user trusts it: ``--trust-code`` on
``run``, ``resume`` and ``sweep``, or ``ASYNCRLHF_TRUST_CODE=1`` in the environment
(which Ray's workers and a sweep's trials inherit). ``validate`` never imports user code,
trusted or not: it checks the rest and lists what a run would import
(:func:`without_imports`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

__all__ = [
    "TRUST_ENV",
    "code_in_spec",
    "code_trusted",
    "importing",
    "is_builtin_path",
    "is_user_path",
    "model_custom_code",
    "names_unchecked",
    "note_unchecked",
    "refusal",
    "skip_plugins",
    "trust_code",
    "without_imports",
]

TRUST_ENV = "ASYNCRLHF_TRUST_CODE"
_TRUE = {"1", "true", "yes", "on"}
_IMPORTING: ContextVar[bool] = ContextVar("asyncrlhf_spec_importing", default=True)
_UNCHECKED: ContextVar[list[str] | None] = ContextVar("asyncrlhf_spec_unchecked", default=None)
_PLUGINS_SKIPPED: ContextVar[bool] = ContextVar("asyncrlhf_spec_plugins_skipped", default=False)


def code_trusted() -> bool:
    """Whether the user opted in to the code specs name (``ASYNCRLHF_TRUST_CODE``)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in _TRUE


@contextlib.contextmanager
def trust_code(on: bool = True) -> Iterator[None]:
    """Trust (or distrust) spec code within the block, and in the processes it starts."""
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def importing() -> bool:
    """False inside :func:`without_imports`: validation imports nothing of the user's."""
    return _IMPORTING.get()


@contextlib.contextmanager
def without_imports() -> Iterator[list[str]]:
    """Validate without importing any user code; yields the list of what was left
    unchecked for want of it (a loss name a plugin may register, say)."""
    notes: list[str] = []
    tokens = _IMPORTING.set(False), _UNCHECKED.set(notes), _PLUGINS_SKIPPED.set(False)
    try:
        yield notes
    finally:
        _IMPORTING.reset(tokens[0])
        _UNCHECKED.reset(tokens[1])
        _PLUGINS_SKIPPED.reset(tokens[2])


def skip_plugins(plugins: Any) -> None:
    """Validation goes on without importing ``plugins``: names they may register are
    noted, not refused (see :func:`names_unchecked`)."""
    if plugins:
        _PLUGINS_SKIPPED.set(True)


def names_unchecked() -> bool:
    """Whether an unregistered loss, estimator or reward name may be a plugin's: the
    spec lists plugins and they were not imported."""
    return not _IMPORTING.get() and _PLUGINS_SKIPPED.get()


def note_unchecked(note: str) -> None:
    """Record a check :func:`without_imports` skipped."""
    notes = _UNCHECKED.get()
    if notes is not None and note not in notes:
        notes.append(note)


def is_builtin_path(path: str) -> bool:
    """``asyncrlhf.rewards.verify:math_score`` and the like: the package's own code."""
    module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
    return module == "asyncrlhf" or module.startswith("asyncrlhf.")


def model_custom_code(path: str) -> str | None:
    """What custom code a local model folder's ``config.json`` names (its ``auto_map``
    classes, or a tokenizer's), or None."""
    names: list[str] = []
    for file in ("config.json", "tokenizer_config.json"):
        try:
            data = json.loads((Path(path) / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto = data.get("auto_map") if isinstance(data, dict) else None
        if isinstance(auto, dict) and auto:
            values = [v for item in auto.values() for v in (item if isinstance(item, list) else [item]) if v]
            names.extend(f"{file} auto_map {v}" for v in values)
    return ", ".join(names) if names else None


def code_in_spec(data: Any) -> list[str]:
    """Each piece of user code the raw spec mapping ``data`` would import, as
    ``field: value (what it is)``; built-in names are not listed."""
    from asyncrlhf.rewards import available_rewards

    if not isinstance(data, dict):
        return []
    found: list[str] = []
    plugins = data.get("plugins")
    for index, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        if isinstance(plugin, str):
            what = "a Python file" if plugin.endswith(".py") else "a module"
            found.append(f"plugins.{index}: {plugin!r} ({what})")
    rewards = data.get("rewards")
    registered = set(available_rewards())
    for index, term in enumerate(rewards if isinstance(rewards, list) else []):
        if not isinstance(term, dict):
            continue
        kind = term.get("kind")
        if isinstance(kind, str) and kind not in registered and kind != "decoded" and is_user_path(kind):
            found.append(f"rewards.{index}.kind: {kind!r} (a module's function)")
        scorer = term.get("scorer")
        if isinstance(scorer, str) and not is_builtin_path(scorer):
            found.append(f"rewards.{index}.scorer: {scorer!r} (a module's function)")
    model = data.get("model")
    if isinstance(model, dict) and model.get("kind") == "pretrained" and isinstance(model.get("path"), str):
        custom = model_custom_code(model["path"])
        if custom:
            found.append(f"model.path: {model['path']!r} (custom model code: {custom})")
    return found


def is_user_path(kind: str) -> bool:
    """A ``module:function`` (or dotted) path to code outside the package."""
    return not is_builtin_path(kind) and (":" in kind or "." in kind)


def refusal(found: list[str]) -> str:
    """The one-line refusal of untrusted code."""
    return (
        f"this spec would run code: {'; '.join(found)}. Run it only if you trust that code: pass --trust-code "
        f"(or set {TRUST_ENV}=1)"
    )
