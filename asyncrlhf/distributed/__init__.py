"""Scale-out on Ray: rollout workers and the trainer as actors.

The only part of the core that imports ``ray``; nothing else imports this package, so
``import asyncrlhf`` works without Ray installed. The names below are imported when first
used, so the Ray-free modules here (``weights``: the weights group over
``torch.distributed``) import without Ray too, as on a GPU machine without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "ActorResources": "resources",
    "RayLayout": "resources",
    "RayOrchestrator": "orchestrator",
    "RolloutActor": "actors",
    "TrainerActor": "actors",
    "WeightRecord": "orchestrator",
    "ray_runtime": "runtime",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
