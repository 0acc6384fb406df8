"""The trainer as a group of N ranks: Ray actors in a placement group, joined by
``torch.distributed`` (gloo on CPU, NCCL on GPU), each a
:class:`~asyncrlhf.training.sharded.ShardedTrainer`.

Every rank runs the same :class:`~asyncrlhf.distributed.actors.TrainerActor` program on
the same data (buffer, advantages, the step, publication, the evaluation); the
collectives inside the trainer keep them in step. Rank 0 speaks for the group: its
results are the driver's and it puts the gathered weights in the object store, piece by
piece; every rank evaluates, generating together on the sharded model. A rank that dies
takes the group down with it: its peers' next collective fails (gloo notices the closed
connection, or gives up after the run's timeout), and so does the run, loudly; it resumes
from its last sharded checkpoint.

:class:`TrainerGroup` is the driver's handle: ``group.train.remote(...)`` calls every rank
and returns rank 0's reference, as one actor's handle would, so the Ray orchestrator
drives one trainer or N the same way.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrlhf.distributed.actors import TrainerActor
from asyncrlhf.distributed.resources import ActorResources, node_endpoint
from asyncrlhf.orchestration.runtime import RunConfig

__all__ = ["TrainerGroup", "TrainerRank"]


class TrainerRank(TrainerActor):
    """One rank of the group; built empty, then :meth:`join`-ed (the process group must be
    up before the trainer shards its model)."""

    def __init__(
        self, trainer_factory: Callable[[], Any], config: RunConfig, torch_threads: int | None, rank: int, world: int
    ) -> None:
        self._args = (trainer_factory, config, torch_threads)
        self.rank, self.world = rank, world

    def address(self) -> str:
        """``host:port`` for the group's rendezvous, on this (rank 0's) node."""
        host, port = node_endpoint()
        return f"{host}:{port}"

    def join(self, address: str, backend: str, timeout_s: float) -> dict[str, Any]:
        """Join the process group at ``address``, then build the trainer; where this rank runs."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, init_method=f"tcp://{address}", rank=self.rank, world_size=self.world, timeout=timeout
        )
        self._build(*self._args)
        context = ray.get_runtime_context()
        return {"rank": self.rank, "node": context.get_node_id(), "pid": os.getpid()}

    def _put(self) -> None:
        if self.rank == 0:
            super()._put()
            return
        for _ in self.trainer.stream_state():  # take part in rank 0's gathers (it gets the pieces)
            pass

    def publish(self) -> tuple[int, str, list[Any]] | None:
        self.side.publish()
        published, self.published, self.events = self.published, None, []
        return published

    def state(self, folder: str) -> dict[str, Any] | None:  # type: ignore[override]
        """Write this rank's shards into ``folder``; rank 0 returns the rest of the state."""
        self.trainer.save_sharded(folder)
        return super().state() if self.rank == 0 else None

    def restore(self, state: dict[str, Any], folder: str | None = None) -> None:
        """From this group's shards, another group's (resharded), or one process's state."""
        if folder is not None:
            self.trainer.load_sharded(folder)
        self.trainer.restore(state["trainer"])
        self.side.buffer.load_state_dict(state["buffer"])


class _Call:
    def __init__(self, group: TrainerGroup, name: str) -> None:
        self.group, self.name = group, name

    def remote(self, *args: Any) -> Any:
        self.group.check()
        refs = [getattr(rank, self.name).remote(*args) for rank in self.group.ranks]
        self.group.pending.extend(refs[1:])
        return refs[0]


class TrainerGroup:
    """The driver's handle on a trainer of ``ranks`` ranks (``ranks == 1``: one plain
    :class:`TrainerActor`, no process group).

    Args:
        trainer_factory: builds the trainer in each rank (a ``ShardedTrainer`` when
            ``ranks > 1``).
        config: the run's config (its trainer view).
        resources: what each rank reserves.
        ranks: N.
        placement: the placement group's strategy (``"PACK"``, ``"SPREAD"``,
            ``"STRICT_SPREAD"``: one rank per node).
        timeout_s: how long placement, the rendezvous and any collective may take.
        weights_thread: give rank 0 a ``weights`` thread (a Ray concurrency group) that
            broadcasts published weights while training goes on.
    """

    def __init__(
        self,
        trainer_factory: Callable[[], Any],
        config: RunConfig,
        resources: ActorResources,
        ranks: int = 1,
        placement: str = "PACK",
        timeout_s: float = 600.0,
        weights_thread: bool = False,
    ) -> None:
        self.pending: list[Any] = []
        self.placement_group = None
        options = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
        groups = {"concurrency_groups": {"weights": 1}} if weights_thread else {}
        if ranks == 1:
            actor = ray.remote(max_restarts=0, **groups)(TrainerActor).options(**options)
            self.ranks = [actor.remote(trainer_factory, config, resources.threads())]
            self.placement: list[dict[str, Any]] = []
            return
        self.placement_group = _place(ranks, resources, placement, timeout_s)
        cls = ray.remote(max_restarts=0, **groups)(TrainerRank)
        self.ranks = [
            cls.options(
                **options,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i
                ),
            ).remote(trainer_factory, config, resources.threads(), i, ranks)
            for i in range(ranks)
        ]
        address = ray.get(self.ranks[0].address.remote(), timeout=timeout_s)
        backend = "nccl" if resources.num_gpus > 0 else "gloo"
        joins = [rank.join.remote(address, backend, timeout_s) for rank in self.ranks]
        self.placement = ray.get(joins, timeout=timeout_s)

    @property
    def sharded(self) -> bool:
        return self.placement_group is not None

    def __getattr__(self, name: str) -> _Call:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Call(self, name)

    def check(self) -> None:
        """Raise a finished follower call's error (a follower that died, a failed collective)."""
        if not self.pending:
            return
        done, self.pending = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        try:
            ray.get(done)
        except ray.exceptions.RayError as error:
            raise self.failure(error) from error

    def failure(self, error: Exception) -> Exception:
        """What to raise for a trainer call that failed: a dead rank named where one is
        (its peers only see a closed connection), else ``error`` itself."""
        dead = []
        for i, rank in enumerate(self.ranks):
            try:
                ray.get(rank.__ray_ready__.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                dead.append(i)
            except ray.exceptions.GetTimeoutError:
                pass  # alive, busy: not the cause
        if not dead:
            return error
        return RuntimeError(
            f"trainer rank {', '.join(map(str, dead))} of {len(self.ranks)} died; a group cannot go on without "
            "a rank: the run stops here and resumes from its last checkpoint (asyncrlhf resume RUN_ID)"
        )

    def state(self, get: Callable[[Any], Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The trainer's checkpoint state and the folders attached to it (the shards)."""
        if not self.sharded:
            return get(self.ranks[0].state.remote()), {}
        folder = tempfile.mkdtemp(prefix="asyncrlhf-shards-")
        refs = [rank.state.remote(folder) for rank in self.ranks]
        return get(refs)[0], {"trainer": folder}

    def restore(self, get: Callable[[Any], Any], state: dict[str, Any], attachments: dict[str, str]) -> None:
        """Any checkpoint onto any group: the shards (``attachments["trainer"]``) of N
        ranks are resharded onto this one's; one process's whole state is split."""
        folder = attachments.get("trainer")
        get([rank.restore.remote(state, folder) for rank in self.ranks])

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)


def _place(ranks: int, resources: ActorResources, strategy: str, timeout_s: float) -> Any:
    """A placement group of one bundle per rank, placed or refused within ``timeout_s``."""
    bundle = {"CPU": resources.num_cpus, **({"GPU": resources.num_gpus} if resources.num_gpus else {})}
    group = placement_group([dict(bundle) for _ in range(ranks)], strategy=strategy)
    try:
        ray.get(group.ready(), timeout=min(timeout_s, 60.0))
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ValueError(
            f"runtime.trainer.ranks={ranks}: the cluster cannot place {ranks} bundles of {bundle} "
            f"with strategy {strategy}"
        ) from None
    return group
