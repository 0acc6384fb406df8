"""The Ray actors: rollout workers and the trainer, each in its own process.

Both are plain classes built from picklable factories (so the core never learns how a
spec becomes a model); :mod:`asyncrlhf.distributed.orchestrator` wraps them with
``ray.remote`` and the resources a spec asks for.

* :class:`RolloutActor` owns an engine. Each call generates one chunk of a batch with
  the weights version it is told to use: when that version is not the one it holds, it
  fetches the published object (one ``ray.put`` by the trainer, shared by every
  rollout actor), loads it and verifies the checksum.
* :class:`TrainerActor` owns the trainer, the replay buffer every rollout actor feeds,
  and the held-out evaluation. Each training call takes the chunks of one batch, pushes
  them through the version-aware buffer, trains, and publishes new weights once when
  due.

Times are wall-clock (``time.time()``) so that events from different processes line up
on one timeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from asyncrlhf.distributed.weights import Layout, WeightChannel, layout_of
from asyncrlhf.models import publish_pieces, weights_checksum
from asyncrlhf.orchestration.evaluate import Evaluation
from asyncrlhf.orchestration.runtime import RunConfig
from asyncrlhf.orchestration.schedule import TrainerSide
from asyncrlhf.orchestration.weights import Snapshot
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import Experience

__all__ = ["Bound", "RolloutActor", "TrainerActor", "joined"]

Event = tuple[str, str, float, float]  # (worker, phase, start, end), wall-clock seconds


def joined(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """A publication's pieces (fetched from the object store) as one state dict."""
    return {name: t for piece in pieces for name, t in piece.items()}


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


class RolloutActor:
    """One rollout worker process.

    Args:
        name: the worker's name on the timeline (``rollout-<i>``).
        engine_factory: builds the engine (its model loaded from a path all nodes see).
        config: the run's :class:`~asyncrlhf.orchestration.RunConfig` (its trainer view:
            reward, group size, token ids, weight verification).
        torch_threads: intra-op threads of this process.
    """

    def __init__(
        self, name: str, engine_factory: Callable[[], Any], config: RunConfig, torch_threads: int | None = None
    ) -> None:
        _set_threads(torch_threads)
        self.name = name
        self.events: list[Event] = []
        self.worker = config.rollout_worker(engine_factory(), name, lambda *event: self.events.append(event))
        # A fresh (or restarted) process holds the engine's initial weights, whatever
        # version they claim: the first chunk always loads and verifies.
        self.loaded: int | None = None
        self.checksum: str | None = None
        self.channel: WeightChannel | None = None

    def pid(self) -> int:
        return os.getpid()

    def join_weights(self, host: str, port: int, rank: int, world: int, layout: Layout, options: dict[str, Any]):
        """Join the weights group (see :mod:`asyncrlhf.distributed.weights`)."""
        self.channel = WeightChannel(host, port, rank, world, layout, **options)

    def receive_weights(self, version: int) -> float:
        """Take ``version``'s broadcast (in the actor's ``weights`` thread); its seconds."""
        assert self.channel is not None
        return self.channel.receive(version)

    def rollout(
        self, key: str, problems: list[Problem], version: int, weights: list[Any], checksum: str, seed: int
    ) -> tuple[dict[str, Any], list[Experience]]:
        """Generate ``problems`` × G experiences with exactly ``version``'s weights,
        sampling from ``seed`` (the chunk's own, whichever worker runs it).

        ``weights`` is the published pieces' ``[ObjectRef, …]`` (a list, so Ray does not
        fetch them unless this actor needs to load them). Returns ``(meta, experiences)``;
        the driver reads the small ``meta`` and hands ``experiences`` to the trainer by
        reference.
        """
        import ray

        self.events = []
        if self.loaded != version:
            start = time.time()
            state = joined(ray.get(weights)) if weights else self._received(version)
            self.events.append((self.name, "wait", start, time.time()))
            self.checksum = self.worker.load_snapshot(Snapshot(version, state, checksum))
            self.loaded = version
        self.worker.engine.reseed(seed)
        experiences = self.worker.generate_batch(problems, key)
        meta = {
            "worker": self.name,
            "pid": os.getpid(),
            "version": version,
            "checksum": self.checksum,
            "tokens": sum(e.response_ids.shape[0] for e in experiences),
            "events": self.events,
        }
        return meta, experiences

    def _received(self, version: int) -> dict[str, Any]:
        if self.channel is None:  # a restarted process is in no group
            raise RuntimeError(f"{self.name} holds no weights channel (restarted?): weight_sync 'collective'")
        return self.channel.wait(version)


class TrainerActor:
    """The trainer process: the run's :class:`~asyncrlhf.orchestration.schedule.TrainerSide`
    (trainer, replay buffer, advantages, evaluation) and the publication of weights to
    the object store.

    Args:
        trainer_factory: builds the :class:`~asyncrlhf.training.TrainerWorker`.
        config: the run's :class:`~asyncrlhf.orchestration.RunConfig` (its trainer view).
        torch_threads: intra-op threads of this process.
    """

    def __init__(self, trainer_factory: Callable[[], Any], config: RunConfig, torch_threads: int | None = None) -> None:
        self._build(trainer_factory, config, torch_threads)

    def _build(self, trainer_factory: Callable[[], Any], config: RunConfig, torch_threads: int | None) -> None:
        _set_threads(torch_threads)
        self.trainer = trainer_factory()
        self.prompts_per_step = config.schedule.prompts_per_step
        self.events: list[Event] = []
        self.published: tuple[int, str, list[Any]] | None = None
        self.channel: WeightChannel | None = None
        self.side = TrainerSide(self.trainer, config, self._put, lambda *event: self.events.append(event))

    def _put(self) -> None:
        """Publish the current weights: into the object store piece by piece (each piece
        put before the next is gathered, so a trainer group's rank 0 never holds them
        whole), or whole into the stage of the weights group's broadcast."""
        import ray

        if self.channel is not None:
            self._stage(self.trainer.state_dict())
            return
        checksum, refs = publish_pieces(self.trainer.stream_state(), ray.put)
        if refs:  # a group's other ranks take part in the gathers and publish nothing
            self.published = (self.trainer.version, checksum, refs)

    def _stage(self, state: dict[str, Any]) -> None:
        """A staged copy of the weights for the weights group's broadcast (``[]`` in place
        of the object-store references)."""
        version, checksum = self.trainer.version, weights_checksum(state)
        if layout_of(state) != self.channel.layout:
            raise RuntimeError("the published weights no longer match the weights group's layout")
        self.channel.stage(version, state)
        self.published = (version, checksum, [])

    def weights_endpoint(self) -> tuple[str, int, Layout]:
        """Where this (rank 0's) node hosts the weights group, and the weights' layout."""
        from asyncrlhf.distributed.resources import node_endpoint

        return *node_endpoint(), self.trainer.weights_layout()

    def join_weights(self, host: str, port: int, world: int, layout: Layout, options: dict[str, Any]) -> None:
        self.channel = WeightChannel(host, port, 0, world, layout, **options)

    def send_weights(self, version: int) -> float:
        """Broadcast a staged version (in the actor's ``weights`` thread); its seconds."""
        assert self.channel is not None
        return self.channel.send(version)

    def restage(self, version: int, state: dict[str, Any]) -> None:
        """A restored ring's version, staged again to broadcast."""
        assert self.channel is not None
        self.channel.stage(version, state)

    def staged_weights(self) -> list[tuple[int, dict[str, Any]]]:
        """The versions kept for the weights group, oldest first (a checkpoint's ring)."""
        assert self.channel is not None
        return list(self.channel.versions.items())

    def publish(self) -> tuple[int, str, list[Any]]:
        """Publish the current weights once: ``(version, checksum, [ref, …])`` (see :meth:`_put`)."""
        self.side.publish()
        published, self.published, self.events = self.published, None, []
        assert published is not None
        return published

    def evaluate(self) -> Evaluation:
        return self.side.evaluate()

    def train(self, step: int, *chunks: list[Experience]) -> dict[str, Any]:
        """Train on one batch (its chunks, in order); publish and evaluate when due."""
        pushed = [self.side.buffer.push(e) for chunk in chunks for e in chunk]
        groups = self.side.buffer.sample(self.prompts_per_step)
        if not all(pushed) or len(groups) != self.prompts_per_step:
            raise RuntimeError(
                f"step {step}: the buffer refused {pushed.count(False)} experiences or returned {len(groups)} of "
                f"{self.prompts_per_step} groups: data outside the staleness bound reached the trainer"
            )
        metrics, staleness, samples, evaluation = self.side.step(step, groups)
        out = {
            "metrics": metrics,
            "staleness": staleness,
            "published": self.published,
            "events": self.events,
            "samples": samples,
            "evaluation": evaluation,
        }
        self.published, self.events = None, []
        return out

    def buffer_stats(self) -> dict[str, int]:
        return self.side.buffer.stats()

    def policy_state(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def adapter(self) -> dict[str, Any] | None:
        return self.trainer.adapter()

    def state(self) -> dict[str, Any]:
        """Trainer and buffer (empty between steps: only its accounting) for a checkpoint."""
        return {"trainer": self.trainer.state(), "buffer": self.side.buffer.state_dict()}

    def restore(self, state: dict[str, Any], folder: str | None = None) -> None:
        """From :meth:`state`; or, with ``folder``, from a trainer group's shards read whole."""
        if folder is None:
            self.trainer.restore(state["trainer"])
        else:
            from asyncrlhf.training.sharded import load_shards

            load_shards(self.trainer.model, self.trainer.optimizer, folder)
            self.trainer._restore_progress(state["trainer"])
        self.side.buffer.load_state_dict(state["buffer"])


class Bound:
    """``factory(index)`` as a zero-argument callable that pickles by value."""

    def __init__(self, factory: Callable[[int], Any], index: int) -> None:
        self.factory, self.index = factory, index

    def __call__(self) -> Any:
        return self.factory(self.index)
