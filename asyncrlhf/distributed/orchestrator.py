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

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError

from asyncrlhf._checks import check_nonnegative_int, check_positive_int
from asyncrlhf.distributed.actors import RolloutActor, TrainerActor
from asyncrlhf.distributed.resources import ActorResources, check_capacity
from asyncrlhf.orchestration.evaluate import EvalCallback
from asyncrlhf.orchestration.history import RunHistory
from asyncrlhf.orchestration.schedule import MetricsCallback, Schedule, StepRecorder
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


class RayOrchestrator:
    """Runs one experiment on a Ray cluster (``ray.init`` must have been called).

    Args:
        engine_factory: ``fn(worker_index) -> engine``, called inside each rollout actor.
        trainer_factory: ``fn() -> TrainerWorker``, called inside the trainer actor.
        problems: training problems (drawn by the driver, sent with each chunk).
        reward_fn, eos_token_id, pad_token_id, schedule, scale_advantages, verify_weights,
            on_metrics, timeout_s, on_eval, eval_scorer: as for the in-process
            :class:`~asyncrlhf.orchestration.Orchestrator`.
        eval_problems: held-out problems, evaluated greedily in the trainer actor.
        max_new_tokens: response cap of the greedy evaluation.
        workers: number of rollout actors.
        rollout_resources, trainer_resources: per-actor CPUs, GPUs, torch threads.
        max_restarts: how often each rollout actor may be restarted.
        seed: seeds each chunk's sampling, so ``sync`` and ``lagged`` runs are
            reproducible whichever worker draws which chunk (and after a restart).
    """

    def __init__(
        self,
        engine_factory: Callable[[int], Any],
        trainer_factory: Callable[[], Any],
        problems: Iterator[Problem],
        reward_fn: Callable[..., Any],
        eos_token_id: int,
        pad_token_id: int,
        schedule: Schedule,
        eval_problems: list[Problem] | None = None,
        max_new_tokens: int = 16,
        scale_advantages: bool = True,
        verify_weights: bool = True,
        on_metrics: MetricsCallback | None = None,
        timeout_s: float = 600.0,
        workers: int = 2,
        rollout_resources: ActorResources = ActorResources(),
        trainer_resources: ActorResources = ActorResources(),
        max_restarts: int = 3,
        seed: int = 0,
        on_eval: EvalCallback | None = None,
        eval_scorer: Callable[..., Any] | None = None,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayOrchestrator needs a Ray cluster: call ray.init() (or use ray_runtime()) first")
        self.schedule = schedule
        self.num_workers = check_positive_int("workers", workers)
        self.max_restarts = check_nonnegative_int("max_restarts", max_restarts)
        check_capacity(workers, rollout_resources, trainer_resources)
        self.problems = problems
        self.on_metrics = on_metrics
        self.timeout_s = timeout_s
        self.seed = seed

        trainer_cls = ray.remote(max_restarts=0)(TrainerActor)
        self.trainer = trainer_cls.options(
            num_cpus=trainer_resources.num_cpus, num_gpus=trainer_resources.num_gpus
        ).remote(
            trainer_factory, self.schedule, eval_problems or [], max_new_tokens, eos_token_id, pad_token_id,
            scale_advantages, trainer_resources.threads(), eval_scorer,
        )  # fmt: skip
        rollout_cls = ray.remote(max_restarts=max_restarts, max_task_retries=0)(RolloutActor)
        self.workers = [_Worker(i, None) for i in range(self.num_workers)]
        for worker in self.workers:
            worker.handle = rollout_cls.options(
                num_cpus=rollout_resources.num_cpus, num_gpus=rollout_resources.num_gpus
            ).remote(
                worker.name, _Bound(engine_factory, worker.index), reward_fn, schedule.group_size, eos_token_id,
                pad_token_id, rollout_resources.threads(), verify_weights,
            )  # fmt: skip
        self.rollout_actors = [w.handle for w in self.workers]
        self.weight_log: list[WeightRecord] = []
        self.trainer_checksums: dict[int, str] = {}
        self.restarts = 0
        self.published = WeightStore(keep=schedule.keep)  # snapshots of [object ref]
        self.recorder = StepRecorder(schedule.mode, on_metrics, on_eval)
        self._restored = False
        self._run: _RunState | None = None

    # ------------------------------------------------------------------ run
    def run(self, num_steps: int, after_step: Callable[[int], None] | None = None) -> RunHistory:
        """Train until ``num_steps`` trainer steps are done (counting those before a
        :meth:`restore`); returns the run's history. ``after_step(steps_done)`` runs on
        the driver after every step."""
        check_positive_int("num_steps", num_steps)
        recorder = self.recorder
        # Actors build their models in the background; throughput and bubbles are
        # measured from the moment all of them are up (start-up is reported apart).
        begin = time.time()
        if not self._restored:
            self._add_published(self._get(self.trainer.publish.remote()))
        for worker in self.workers:
            worker.pid = self._get(worker.handle.pid.remote())
        recorder.begin(keep_elapsed=self._restored)
        startup = recorder.t0 - begin
        if self.schedule.eval_every and not self._restored:
            recorder.initial(self._get(self.trainer.evaluate.remote()))

        done = recorder.steps_done
        run = _RunState(num_steps, _split(self.schedule.prompts_per_step, self.num_workers), deque(self.workers))
        run.enqueued = run.next_submit = run.next_train = done
        self._run = run
        while run.next_train < num_steps:
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
                    after_step(recorder.steps_done)
            elif ready[0] in run.probes:
                self._probed(run, ready[0])
            else:
                self._chunk_done(run, ready[0])
        extra = {"faults/rollout_restarts": float(self.restarts), "time/startup_s": startup}
        return recorder.finish([w.name for w in self.workers], extra)

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
                run.queue.extend(_Chunk(run.enqueued, c, self._draw(n)) for c, n in enumerate(run.sizes))
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
        out = ray.get(run.training.popleft())
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
        except RayActorError:
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

    def checkpoint(self, write: Callable[[dict[str, Any]], None]) -> None:
        """Call ``write(state)`` with the run state after the last finished step (call it
        from ``after_step``). Trainer steps already queued on the actor finish first, so
        the state is that of a step boundary; chunks in flight are not kept: a restored
        run generates those batches again (the same samples in ``sync``/``lagged``, each
        chunk being seeded by its batch)."""
        run = self._run
        while run.training:  # a queued step finishes: the checkpoint follows it
            self._trained(run)
        ring = [(version, self._get(ref[0]), checksum) for version, ref, checksum in self.published.state_dict()]
        write({
            "steps_done": self.recorder.steps_done,
            "trainer": self._get(self.trainer.state.remote()),
            "weights": ring,
            "rollout": {"problems_drawn": self.recorder.steps_done * self.schedule.prompts_per_step},
            "record": self.recorder.state_dict(),
            "restarts": self.restarts,
        })  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Put a :meth:`checkpoint` back before :meth:`run`: the trainer actor's state,
        the published ring (put into the object store again), the prompt stream."""
        if self._restored or self.recorder.steps_done:
            raise RuntimeError("restore() needs a freshly built orchestrator that has not run")
        self._get(self.trainer.restore.remote(state["trainer"]))
        for version, weights, checksum in state["weights"]:
            self._add_published((int(version), checksum, [ray.put(weights)]))
        for _ in range(int(state["rollout"]["problems_drawn"])):  # the stream is deterministic: replay it
            next(self.problems)
        self.recorder.load_state_dict(state["record"])
        self.restarts = int(state["restarts"])
        self._restored = True

    def buffer_stats(self) -> dict[str, int]:
        """The trainer's buffer counters (pushed, sampled, dropped, evicted, size)."""
        return self._get(self.trainer.buffer_stats.remote())

    def shutdown(self) -> None:
        """Kill the actors (their resources return to the cluster)."""
        for handle in [self.trainer, *self.rollout_actors]:
            ray.kill(handle, no_restart=True)

    # ------------------------------------------------------------ helpers
    def _draw(self, n: int) -> list[Problem]:
        return [next(self.problems) for _ in range(n)]

    def _get(self, ref: Any) -> Any:
        return ray.get(ref, timeout=self.timeout_s)

    def _add_published(self, published: tuple[int, str, list[Any]]) -> None:
        version, checksum, ref = published
        self.published.publish(version, ref, checksum)
        self.trainer_checksums[version] = checksum

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


class _Bound:
    """``factory(index)`` as a zero-argument callable that pickles by value."""

    def __init__(self, factory: Callable[[int], Any], index: int) -> None:
        self.factory, self.index = factory, index

    def __call__(self) -> Any:
        return self.factory(self.index)


def _split(total: int, parts: int) -> list[int]:
    """``total`` prompts as ``min(parts, total)`` chunk sizes differing by at most one."""
    parts = min(parts, total)
    return [total // parts + (i < total % parts) for i in range(parts)]
