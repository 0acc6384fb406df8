"""Scale-out on Ray: rollout workers and the trainer as actors.

The only part of the core that imports ``ray``; nothing else imports this package, so
``import asyncrlhf`` works without Ray installed.
"""

from asyncrlhf.distributed.actors import RolloutActor, TrainerActor
from asyncrlhf.distributed.orchestrator import RayOrchestrator, WeightRecord
from asyncrlhf.distributed.resources import ActorResources, RayLayout
from asyncrlhf.distributed.runtime import ray_runtime

__all__ = [
    "ActorResources",
    "RayLayout",
    "RayOrchestrator",
    "RolloutActor",
    "TrainerActor",
    "WeightRecord",
    "ray_runtime",
]
