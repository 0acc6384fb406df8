"""What a Ray run reserves: per-actor resources, checked against the cluster up front."""

from __future__ import annotations

from dataclasses import dataclass

import ray

__all__ = ["ActorResources", "RayLayout", "check_capacity", "node_endpoint"]


@dataclass(frozen=True)
class ActorResources:
    """What one actor reserves on the cluster; ``torch_threads`` defaults to its CPUs."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int | None = None

    def threads(self) -> int:
        return self.torch_threads or max(1, int(self.num_cpus))


@dataclass(frozen=True)
class RayLayout:
    """How a Ray run lays out on the cluster.

    Args:
        workers: number of rollout actors.
        rollout, trainer: what each rollout actor and the trainer actor reserve.
        max_restarts: how often each rollout actor may be restarted.
        ranks: trainer ranks (> 1: a group joined by ``torch.distributed``, each rank
            reserving ``trainer``).
        placement: the trainer group's placement strategy (``PACK``, ``SPREAD``,
            ``STRICT_SPREAD``: one rank per node).
        weight_sync: how weights reach rollout actors: ``"object_store"`` (one
            ``ray.put`` per version) or ``"collective"`` (a broadcast over a process group
            of trainer rank 0 and the rollout actors, :mod:`asyncrlhf.distributed.weights`).
        seed: seeds each chunk's sampling, so ``sync`` and ``lagged`` runs are
            reproducible whichever worker draws which chunk (and after a restart).
    """

    workers: int = 2
    rollout: ActorResources = ActorResources()
    trainer: ActorResources = ActorResources()
    max_restarts: int = 3
    seed: int = 0
    ranks: int = 1
    placement: str = "PACK"
    weight_sync: str = "object_store"


def check_capacity(
    workers: int, rollout: ActorResources, trainer: ActorResources, ranks: int = 1, placement: str = "PACK"
) -> None:
    """Fail now, not hang later, when the cluster cannot place every actor (and, for a
    ``STRICT_SPREAD`` group, when fewer nodes than ranks could hold a rank each)."""
    _check_totals(workers, rollout, trainer, ranks)
    if ranks > 1 and placement == "STRICT_SPREAD":
        need = {"CPU": trainer.num_cpus, "GPU": trainer.num_gpus}
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        fit = sum(all(n["Resources"].get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v) for n in nodes)
        if fit < ranks:
            raise ValueError(
                f"placement STRICT_SPREAD puts each of {ranks} trainer ranks on its own node, but {fit} of the "
                f"cluster's {len(nodes)} nodes can hold one ({trainer.num_cpus:g} CPUs, {trainer.num_gpus:g} GPUs)"
            )


def _check_totals(workers: int, rollout: ActorResources, trainer: ActorResources, ranks: int) -> None:
    total = ray.cluster_resources()
    for resource, per_rollout, per_trainer in [
        ("CPU", rollout.num_cpus, trainer.num_cpus),
        ("GPU", rollout.num_gpus, trainer.num_gpus),
    ]:
        need, have = workers * per_rollout + ranks * per_trainer, total.get(resource, 0.0)
        if need > have + 1e-9:
            raise ValueError(
                f"the run needs {need:g} {resource}s ({workers} rollout workers × {per_rollout:g} + {ranks} trainer "
                f"rank{'s' if ranks > 1 else ''} × {per_trainer:g}) but the Ray cluster has {have:g}"
            )


def node_endpoint() -> tuple[str, int]:
    """This node's address and a port free on it now, for a group's rendezvous hosted here."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port
