"""The Ray orchestrator: N rollout actors and one trainer actor, driven from the driver.

The driver owns the schedule, never the data. Each trainer batch is split into one
chunk per rollout worker; an idle worker takes the next chunk as soon as the weights
that chunk may use are published (the same :class:`~asyncrlhf.orchestration.Schedule`
as in process: exactly version n − k in ``sync``/``lagged``, the newest version
≥ n − max_staleness in ``async``; the same ring of published versions, here of object
references). Experiences go from the rollout actor to the
trainer actor by object reference; the driver only reads each chunk's small metadata
(version used, checksum held, timeline). When every chunk of batch n is in, the
trainer pushes them through its version-aware buffer and trains; staleness is
bounded by construction, and the buffer would refuse anything outside the bound.

Weights: after a step that is due to publish, the trainer puts its weights in the
object store once; every rollout actor that needs that version fetches the same
object, loads it and verifies the engine's checksum against the trainer's (a mismatch
fails the chunk, and the run). ``weight_log`` records, per chunk, the checksum the actor
held and the trainer's.

Faults: rollout actors restart (``max_restarts``). A chunk lost with its actor goes
back to the head of the queue with the same prompts, so nothing is skipped or
counted twice; each restart is a timeline event and the ``faults/rollout_restarts``
metric. The worker gets work again once a probe reaches its restarted process; a
restart while the actor was idle is caught by its new process id.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError, RayError

from asyncrlhf._checks import check_nonnegative_int, check_positive_int
from asyncrlhf.distributed.actors import Bound, RolloutActor, joined
from asyncrlhf.distributed.group import TrainerGroup
from asyncrlhf.distributed.resources import RayLayout, check_capacity
from asyncrlhf.distributed.weights import WeightBroadcasts
from asyncrlhf.orchestration.evaluate import Evaluation
from asyncrlhf.orchestration.runtime import AfterStep, RunConfig, RuntimeBase
from asyncrlhf.orchestration.weights import WeightStore
from asyncrlhf.tasks.base import Problem

__all__ = ["RayOrchestrator", "WeightRecord"]


@dataclass(frozen=True)
class WeightRecord:
    """One chunk's weights: which worker generated it with which version and checksum."""

    worker: str
    pid: int
    batch: int
    version: int
    checksum: str
    trainer_checksum: str


@dataclass
class _Chunk:
    batch: int
    index: int
    problems: list[Problem]
    attempts: int = 0


@dataclass
class _Worker:
    index: int
    handle: Any
    pid: int | None = None
    failures: int = 0
    alive: bool = True
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"rollout-{self.index}"


@dataclass
class _RunState:
    """The driver's bookkeeping for one run."""

    num_steps: int
    sizes: list[int]  # prompts of each chunk of a batch
    idle: deque[_Worker]
    queue: deque[_Chunk] = field(default_factory=deque)  # chunks waiting for a worker, in order
    enqueued: int = 0  # batches whose chunks were queued
    inflight: dict[Any, tuple[_Worker, _Chunk, Any]] = field(default_factory=dict)  # meta ref → chunk
    done: dict[int, dict[int, Any]] = field(default_factory=lambda: defaultdict(dict))  # batch → chunk → ref
    probes: dict[Any, _Worker] = field(default_factory=dict)  # pid probe ref → worker coming back
    training: deque[Any] = field(default_factory=deque)  # submitted trainer steps, oldest first
    next_submit: int = 0  # the next batch to hand to the trainer
    next_train: int = 0  # the next trainer step to finish


class RayOrchestrator(RuntimeBase):
    """Runs one experiment on a Ray cluster (``ray.init`` must have been called), a
    :class:`~asyncrlhf.orchestration.runtime.Runtime`.

    Args:
        engine_factory: ``fn(worker_index) -> engine``, called inside each rollout actor.
        trainer_factory: ``fn() -> TrainerWorker``, called inside the trainer actor.
        config: the run's :class:`~asyncrlhf.orchestration.RunConfig` (problems are
            drawn by the driver and sent with each chunk; the held-out evaluation runs
            in the trainer actor).
        layout: workers, per-actor resources, restarts, the chunks' sampling seed.
    """

    def __init__(
        self,
        engine_factory: Callable[[int], Any],
        trainer_factory: Callable[[], Any],
        config: RunConfig,
        layout: RayLayout = RayLayout(),
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayOrchestrator needs a Ray cluster: call ray.init() (or use ray_runtime()) first")
        if config.schedule.inflight:  # before any actor starts
            raise ValueError("inflight: the Ray runtime loads weights between chunks only; use the local runtime")
        super().__init__(config)
        self.num_workers = check_positive_int("workers", layout.workers)
        self.max_restarts = check_nonnegative_int("max_restarts", layout.max_restarts)
        check_positive_int("ranks", layout.ranks)
        check_capacity(layout.workers, layout.rollout, layout.trainer, layout.ranks, layout.placement)
        self.seed = layout.seed
        if layout.weight_sync not in ("object_store", "collective"):
            raise ValueError(f"weight_sync must be 'object_store' or 'collective', got {layout.weight_sync!r}")
        collective = layout.weight_sync == "collective"
        group = (trainer_factory, config.for_trainer(), layout.trainer, layout.ranks, layout.placement, self.timeout_s)
        self.trainer = TrainerGroup(*group, weights_thread=collective)
        # A restarted rollout process would be in no weights group: with one, a death stops the run
        groups = {"concurrency_groups": {"weights": 1}, "max_restarts": 0} if collective else {}
        rollout_cls = ray.remote(**{"max_restarts": layout.max_restarts, "max_task_retries": 0, **groups})(RolloutActor)
        resources = layout.rollout
        self.workers = [_Worker(i, None) for i in range(self.num_workers)]
        for worker in self.workers:
            worker.handle = rollout_cls.options(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus).remote(
                worker.name, Bound(engine_factory, worker.index), config.for_trainer(), resources.threads()
            )
        self.rollout_actors = [w.handle for w in self.workers]
        self.broadcasts = self._weights_group(layout) if collective else None
        self.weight_log: list[WeightRecord] = []
        self.trainer_checksums: dict[int, str] = {}
        self.restarts = 0
        self.published = WeightStore(keep=self.schedule.keep)  # snapshots of [object ref]
        self._run: _RunState | None = None
        self._begin = self._startup = 0.0
        self._closed = False

    def _weights_group(self, layout: RayLayout) -> WeightBroadcasts:
        rank0 = self.trainer.ranks[0]
        on_gpus = layout.trainer.num_gpus > 0 and layout.rollout.num_gpus > 0
        # each end keeps the versions a lagged schedule reads, and two more: a broadcast
        # may overtake the chunk (or the checkpoint) that reads an older one
        options = {"timeout_s": self.timeout_s, "keep": self.schedule.keep + 2, "device": "cuda" if on_gpus else "cpu"}
        return WeightBroadcasts(self._get(rank0.weights_endpoint.remote()), rank0, self.rollout_actors, options)

    # ------------------------------------------------------------ run hooks
    def _publish_initial(self) -> None:
        # Actors build their models in the background; throughput and bubbles are
        # measured from the moment all of them are up (start-up is reported apart).
        self._begin = time.time()
        self._add_published(self._get(self.trainer.publish.remote()))

    def _ready(self) -> None:
        self._begin = self._begin or time.time()  # a restored run publishes nothing first
        for worker in self.workers:
            worker.pid = self._get(worker.handle.pid.remote())
        self._startup = time.time() - self._begin

    def _evaluate(self) -> Evaluation:
        return self._get(self.trainer.evaluate.remote())

    def _workers(self) -> list[str]:
        return [w.name for w in self.workers]

    def _summary(self) -> dict[str, float]:
        nodes = len({rank["node"] for rank in self.trainer.placement}) if self.trainer.placement else 1
        return {
            "faults/rollout_restarts": float(self.restarts),
            "time/startup_s": self._startup,
            "trainer/ranks": float(len(self.trainer.ranks)),
            "trainer/nodes": float(nodes),
            **(self.broadcasts.summary() if self.broadcasts is not None else {"weights/collective": 0.0}),
        }

    def _loop(self, first: int, num_steps: int, after_step: AfterStep | None) -> None:
        run = _RunState(num_steps, _split(self.schedule.prompts_per_step, self.num_workers), deque(self.workers))
        run.enqueued = run.next_submit = run.next_train = first
        self._run = run
        while run.next_train < num_steps:
            if self.broadcasts is not None:
                self.broadcasts.check()
            self._dispatch(run)
            self._submit(run)
            head = list(run.training)[:1]  # trainer steps finish in order
            waitable = [*run.inflight, *run.probes, *head]
            if not waitable:
                raise RuntimeError("no rollout worker is left alive and no batch is training")
            ready, _ = ray.wait(waitable, num_returns=1, timeout=self.timeout_s)
            if not ready:
                raise TimeoutError(f"nothing finished within {self.timeout_s}s (step {run.next_train})")
            if head and ready[0] == head[0]:
                self._trained(run)
                if after_step is not None:
                    after_step(self.recorder.steps_done)
            elif ready[0] in run.probes:
                self._probed(run, ready[0])
            else:
                self._chunk_done(run, ready[0])

    def _submit(self, run: _RunState) -> None:
        """Hand the trainer the next batch as soon as all its chunks are in. Up to two
        steps are queued on the trainer actor, so it starts the next one (and Ray fetches
        its data) without waiting for the driver's round trip."""
        while len(run.training) < 2 and len(run.done.get(run.next_submit, {})) == len(run.sizes):
            chunks = run.done.pop(run.next_submit)
            ordered = [chunks[c] for c in range(len(chunks))]
            run.training.append(self.trainer.train.remote(run.next_submit, *ordered))
            run.next_submit += 1

    def _dispatch(self, run: _RunState) -> None:
        """Hand chunks to idle workers, in order, as far as published weights allow."""
        while run.idle:
            if not run.queue and run.enqueued < run.num_steps:
                run.queue.extend(_Chunk(run.enqueued, c, self.draw(n)) for c, n in enumerate(run.sizes))
                run.enqueued += 1
            if not run.queue:
                return
            weights = self.published.find(self.schedule.required_version(run.queue[0].batch), self.schedule.exact)
            if weights is None:
                return
            chunk, worker = run.queue.popleft(), run.idle.popleft()
            version, checksum, ref = weights.version, weights.checksum, weights.weights
            chunk.attempts += 1
            key = f"b{chunk.batch}c{chunk.index}a{chunk.attempts}"
            seed = hash((self.seed, chunk.batch, chunk.index)) & 0x7FFF_FFFF  # ints hash stably
            meta_ref, exp_ref = worker.handle.rollout.options(num_returns=2).remote(
                key, chunk.problems, version, ref, checksum, seed
            )
            run.inflight[meta_ref] = (worker, chunk, exp_ref)

    def _trained(self, run: _RunState) -> None:
        """A trainer step finished: record it, take its published weights, report."""
        out = self._get(run.training.popleft())
        for event in out["events"]:
            self.recorder.event(*event)
        if out["published"] is not None:
            self._add_published(out["published"])
        out["metrics"]["faults/rollout_restarts"] = float(self.restarts)
        self.recorder.step(out["metrics"], out["staleness"], out["samples"], out["evaluation"])
        run.next_train += 1

    def _chunk_done(self, run: _RunState, ref: Any) -> None:
        """A chunk finished (or its actor died): verify it and keep its experiences' reference."""
        worker, chunk, exp_ref = run.inflight.pop(ref)
        try:
            meta = ray.get(ref)
        except RayActorError as error:
            if self.broadcasts is not None:
                raise RuntimeError(
                    f"{worker.name} died; with runtime.weight_sync 'collective' its group cannot take a restarted "
                    "process: the run stops here and resumes from its last checkpoint"
                ) from error
            # The actor died under the chunk: the chunk goes first in line again, and
            # the worker comes back once a probe reaches its restarted process.
            worker.failures += 1
            self._restart_event(worker)
            run.queue.appendleft(chunk)
            run.probes[worker.handle.pid.remote()] = worker
            return
        self._received(worker, chunk, meta)
        self.recorder.tokens += meta["tokens"]
        run.done[chunk.batch][chunk.index] = exp_ref
        run.idle.append(worker)

    # ---------------------------------------------------------- checkpoints
    def policy_state(self) -> dict[str, Any]:
        """The trained policy's weights (fetched from the trainer actor)."""
        return self._get(self.trainer.policy_state.remote())

    def adapter(self) -> dict[str, Any] | None:
        return self._get(self.trainer.adapter.remote())

    @contextlib.contextmanager
    def _pause(self) -> Iterator[None]:
        """Trainer steps already queued on the actor finish first, so the state is that of
        a step boundary; chunks in flight are not kept: a restored run generates those
        batches again (the same samples in ``sync``/``lagged``, each chunk being seeded by
        its batch)."""
        run = self._run
        while run is not None and run.training:  # a queued step finishes: the checkpoint follows it
            self._trained(run)
        yield

    def _own_state(self) -> dict[str, Any]:
        staged = dict(self._get(self.trainer.ranks[0].staged_weights.remote())) if self.broadcasts else {}
        ring = [
            (version, staged[version] if staged else joined(self._get(ref)), checksum)
            for version, ref, checksum in self.published.state_dict()
        ]
        trainer, attachments = self.trainer.state(self._get)
        state = {"trainer": trainer, "weights": ring, "restarts": self.restarts}
        return {**state, "attachments": attachments} if attachments else state

    def _drawn_at_checkpoint(self) -> int:
        return self.recorder.steps_done * self.schedule.prompts_per_step

    def _load_own_state(self, state: dict[str, Any]) -> None:
        """The trainer actor's state and the published ring (put into the object store again)."""
        self.trainer.restore(self._get, state["trainer"], state.get("attachments", {}))
        for version, weights, checksum in state["weights"]:
            if self.broadcasts is None:
                self._add_published((int(version), checksum, [ray.put(weights)]))
                continue
            self._get(self.trainer.ranks[0].restage.remote(int(version), weights))
            self._add_published((int(version), checksum, []))
        self.restarts = int(state["restarts"])

    def buffer_stats(self) -> dict[str, int]:
        """The trainer's buffer counters (pushed, sampled, dropped, evicted, size)."""
        return self._get(self.trainer.buffer_stats.remote())

    def close(self) -> None:
        """Kill the actors (their resources return to the cluster), then close the reward."""
        if not self._closed:
            self._closed = True
            self.trainer.kill()
            for handle in self.rollout_actors:
                ray.kill(handle, no_restart=True)
        super().close()

    # ------------------------------------------------------------ helpers

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except RayError as error:
            raise self.trainer.failure(error) from error

    def _add_published(self, published: tuple[int, str, list[Any]]) -> None:
        version, checksum, ref = published
        self.published.publish(version, ref, checksum)
        self.trainer_checksums[version] = checksum
        if self.broadcasts is not None:
            self.broadcasts.publish(version)

    def _received(self, worker: _Worker, chunk: _Chunk, meta: dict[str, Any]) -> None:
        if meta["pid"] != worker.pid:  # restarted while idle: no call failed
            self._restart_event(worker)
            worker.pid = meta["pid"]
        # The actor already verified its load against the trainer's checksum (it fails
        # the chunk otherwise); the log keeps both for inspection.
        version, held = meta["version"], meta["checksum"]
        record = WeightRecord(worker.name, meta["pid"], chunk.batch, version, held, self.trainer_checksums[version])
        self.weight_log.append(record)
        for event in meta["events"]:
            self.recorder.event(*event)

    def _probed(self, run: _RunState, ref: Any) -> None:
        """A restarted worker answered (back to work), is still restarting (probe again),
        or is gone for good (dropped; the run fails only when no worker is left)."""
        worker = run.probes.pop(ref)
        try:
            worker.pid = ray.get(ref)
        except ActorDiedError:
            worker.alive = False
        except RayActorError:
            if worker.failures <= self.max_restarts:
                time.sleep(0.1)
                run.probes[worker.handle.pid.remote()] = worker
                return
            worker.alive = False
        if worker.alive:
            run.idle.append(worker)
        elif not any(w.alive for w in self.workers):
            raise RuntimeError(f"every rollout worker died and ran out of restarts (max_restarts={self.max_restarts})")

    def _restart_event(self, worker: _Worker) -> None:
        self.restarts += 1
        now = time.time()
        self.recorder.event(worker.name, "restart", now, now)


def _split(total: int, parts: int) -> list[int]:
    """``total`` prompts as ``min(parts, total)`` chunk sizes differing by at most one."""
    parts = min(parts, total)
    return [total // parts + (i < total % parts) for i in range(parts)]
