"""The run loop, in one process: rollout in a thread, training in the caller's.

Read this file to learn how a run goes; :mod:`asyncrlhf.orchestration.schedule` holds
its rules (which weights each batch uses, buffer sizing, publish and eval cadence, the
step record), which the Ray runtime (:mod:`asyncrlhf.distributed`) shares.

    publish version 0 → load it (verified) → evaluate
    sync:          for each step n: generate batch n with version n → train → publish n + 1
    async/lagged:  a rollout thread generates batch after batch, each with the weights
                   the schedule allows (waiting for them if need be) and pushes them to
                   the buffer; the trainer takes one batch per step from the buffer,
                   trains, publishes when due, evaluates when due.

Every weight load is checksum-verified against the trainer's snapshot; the buffer
refuses data outside the staleness bound, so the bound holds by construction and is
checked again at the door.

Checkpoints: :meth:`~RuntimeBase.checkpoint` captures the whole run state between two
steps (trainer, buffer, published-weights ring, the engine's sampling stream, the prompt
stream's position, the record) with the rollout thread paused between batches;
:meth:`~RuntimeBase.restore` puts it back before :meth:`~RuntimeBase.run`, which then
continues at the next step: exactly as the uninterrupted run in ``sync`` and ``lagged``.
The run's start, end and the shared half of checkpoints are
:class:`~asyncrlhf.orchestration.runtime.RuntimeBase`'s.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import torch

from asyncrlhf._clock import clock
from asyncrlhf.orchestration.evaluate import Evaluation
from asyncrlhf.orchestration.runtime import AfterStep, RunConfig, RuntimeBase
from asyncrlhf.orchestration.schedule import MODES, Schedule, TrainerSide
from asyncrlhf.orchestration.stream import RolloutStream
from asyncrlhf.orchestration.weights import WeightStore, WeightStoreClosed
from asyncrlhf.rollout.base import InFlight, RolloutEngine
from asyncrlhf.training.trainer import TrainerWorker
from asyncrlhf.types import Experience

__all__ = ["MODES", "Orchestrator", "Schedule"]


class Orchestrator(RuntimeBase):
    """Joins a rollout engine and a trainer through a group-aware, version-aware buffer,
    in this process (a :class:`~asyncrlhf.orchestration.runtime.Runtime`).

    Args:
        engine: the rollout engine (its weights are replaced from the trainer's).
        trainer: the trainer (owns the policy being optimised).
        config: the run's :class:`~asyncrlhf.orchestration.RunConfig`.
    """

    def __init__(self, engine: RolloutEngine, trainer: TrainerWorker, config: RunConfig) -> None:
        super().__init__(config)
        if config.schedule.inflight and not getattr(engine, "updates_in_flight", False):
            raise ValueError(
                f"inflight: {type(engine).__name__} cannot load weights between decode steps (updates_in_flight)"
            )
        self.engine, self.trainer = engine, trainer
        self.weights = WeightStore(keep=self.schedule.keep)
        self.worker = config.rollout_worker(engine, "rollout-0", self._event)
        self.trainer_side = TrainerSide(trainer, config, self._publish, self._event)
        self.buffer = self.trainer_side.buffer
        self.versions = self.trainer_side.versions
        self._rollout_lock = threading.Lock()  # held while a batch is generated and pushed
        self._next_batch = 0  # the next batch the rollout side generates
        self._force_load = True  # the first load is verified even if the engine claims the version
        self.stream = self._make_stream() if self.schedule.streams else None

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The trained policy's weights (a copy)."""
        return self.trainer.state_dict()

    def adapter(self) -> dict[str, Any] | None:
        return self.trainer.adapter()

    def buffer_stats(self) -> dict[str, int]:
        return self.buffer.stats()

    # ------------------------------------------------------------ run hooks
    def _publish_initial(self) -> None:
        self.trainer_side.publish()

    def _evaluate(self) -> Evaluation:
        return self.trainer_side.evaluate()

    def _loop(self, first: int, num_steps: int, after_step: AfterStep | None) -> None:
        if self.schedule.mode == "sync":
            for step in range(first, num_steps):
                self._rollout(step)
                self._train(step, after_step)
        else:
            self._run_concurrently(first, num_steps, after_step)

    def _workers(self) -> list[str]:
        return [self.worker.name]

    # ----------------------------------------------------- checkpoint hooks
    def _pause(self) -> Any:
        return self._rollout_lock  # the rollout side waits between batches

    def _own_state(self) -> dict[str, Any]:
        return {
            "trainer": self.trainer.state(),
            "buffer": self.buffer.state_dict(),
            "weights": self.weights.state_dict(),
            "engine": {"version": self.engine.version, "rng": self.engine.rng_state()},
            "rollout": {"next_batch": self._next_batch},
            **({"stream": self.stream.state_dict()} if self.stream is not None else {}),
        }

    def _load_own_state(self, state: dict[str, Any]) -> None:
        self.trainer.restore(state["trainer"])
        self.buffer.load_state_dict(state["buffer"])
        self.weights.load_state_dict(state["weights"])
        self.engine.set_rng_state(state["engine"]["rng"])
        self._next_batch = int(state["rollout"]["next_batch"])
        if self.stream is not None:
            self.stream.load_state_dict(state["stream"])

    def _run_concurrently(self, first: int, num_steps: int, after_step: AfterStep | None) -> None:
        stop = threading.Event()
        failure: list[BaseException] = []

        def rollout() -> None:
            try:
                if self.stream is not None:
                    return self._stream(stop)
                for batch in itertools.count(self._next_batch):
                    if stop.is_set():
                        return
                    self._rollout(batch)
            except WeightStoreClosed:
                pass
            except BaseException as err:  # surfaced by the trainer loop
                failure.append(err)
                self.buffer.close()

        thread = threading.Thread(target=rollout, name="rollout-0", daemon=True)
        thread.start()
        try:
            for step in range(first, num_steps):
                self._train(step, after_step, failure)
        finally:
            stop.set()
            self.weights.close()
            self.buffer.close()
            thread.join(timeout=self.timeout_s)
        if failure:
            raise RuntimeError(f"rollout worker failed: {failure[0]!r}") from failure[0]

    # ------------------------------------------------------------- rollout
    def _holds(self, batch: int) -> bool:
        """Whether the engine already holds exactly the weights batch ``batch`` needs."""
        needed = self.schedule.required_version(batch)
        return not self._force_load and self.schedule.exact and self.engine.version == needed

    def _await(self, batch: int) -> None:
        """Wait until the weights batch ``batch`` may use are published (unless held);
        with switches planned in flight, its last version, so no switch waits."""
        last = self.schedule.last_version(batch)
        if not self._holds(batch) or last != self.engine.version:
            start = time.time()
            self.weights.wait(last, self.schedule.exact, self.timeout_s)
            self._event(self.worker.name, "wait", start, time.time())

    def _load(self, batch: int) -> None:
        """Load the (published) weights batch ``batch`` may use, verified, unless held."""
        if self._holds(batch):
            return
        snapshot = self.weights.find(self.schedule.required_version(batch), self.schedule.exact)
        assert snapshot is not None, f"weights for batch {batch} are not published"
        if self._force_load or snapshot.version != self.engine.version:
            self.worker.load_snapshot(snapshot)
        self._force_load = False

    def _rollout(self, batch: int) -> None:
        """Generate batch ``batch`` with the weights it may use and push it to the buffer."""
        self._await(batch)  # outside the lock: a checkpoint may be taken meanwhile
        with self._rollout_lock:
            self._load(batch)
            problems = self.draw(self.schedule.prompts_per_step)
            experiences = self.worker.generate_batch(problems, key=f"b{batch}", inflight=self._inflight(batch))
            self.recorder.tokens += sum(e.response_ids.shape[0] for e in experiences)
            for experience in experiences:
                self.buffer.push(experience)
            self._next_batch = batch + 1

    # ------------------------------------------------- continuous rollout
    def _make_stream(self) -> RolloutStream:
        schedule = self.schedule
        capacity = schedule.prompts_per_step * schedule.group_size  # a batch's rows at once
        return RolloutStream(self.worker, capacity, schedule.chunk_tokens, self.engine.max_new_tokens)  # type: ignore[attr-defined]

    def _stream(self, stop: threading.Event) -> None:
        """``async`` with ``inflight``: admit, advance, hand on, until stopped (see
        :mod:`~asyncrlhf.orchestration.stream`)."""
        stream, schedule = self.stream, self.schedule
        assert stream is not None
        per_step = schedule.prompts_per_step

        def allowed(index: int) -> bool:  # the step group ``index`` is reserved for is within the bound
            return self.engine.version >= schedule.required_version(index // per_step)

        while not stop.is_set():
            with self._rollout_lock:
                self._load_newer()
                stream.admit(self.draw, allowed)
                start = clock()
                produced = stream.advance(InFlight(lambda _: self._load_newer(), schedule.recompute_kv))
                self.worker.event("generate", start)
                self.recorder.tokens += produced
                for group in stream.ready():
                    for experience in group:
                        self.buffer.push(experience)
            if stream.active_rows == 0:  # none admitted: wait for the weights the next group needs
                start_wait = time.time()
                self.weights.wait(schedule.required_version(stream.admitted // per_step), False, self.timeout_s)
                self._event(self.worker.name, "wait", start_wait, time.time())

    def _load_newer(self) -> None:
        """Load the newest published version if it is newer than the engine's (verified)."""
        snapshot = self.weights.find(0 if self._force_load else self.engine.version + 1, exact=False)
        if snapshot is not None:
            self.worker.load_snapshot(snapshot)
            self._force_load = False

    def _inflight(self, batch: int) -> InFlight | None:
        """The weight loads between batch ``batch``'s decode steps: the planned switches
        of ``lagged`` (``async`` streams instead, see :meth:`_stream`)."""
        schedule, weights, worker = self.schedule, self.weights, self.worker
        if not schedule.inflight:
            return None

        def planned(position: int) -> None:
            version = schedule.switch_version(batch, position)
            if version is not None and version != self.engine.version:
                snapshot = weights.find(version, exact=True)
                assert snapshot is not None, f"version {version} was awaited before batch {batch}"
                worker.load_snapshot(snapshot)

        return InFlight(planned, schedule.recompute_kv)

    # ------------------------------------------------------------- trainer
    def _train(self, step: int, after_step: AfterStep | None, failure: list[BaseException] | None = None) -> None:
        start = time.time()
        groups = self._collect(failure)
        self._event("trainer", "wait", start, time.time())
        self.recorder.step(*self.trainer_side.step(step, groups))
        if after_step is not None:
            after_step(self.recorder.steps_done)

    def _collect(self, failure: list[BaseException] | None) -> list[list[Experience]]:
        groups: list[list[Experience]] = []
        deadline = time.monotonic() + self.timeout_s
        wanted = self.schedule.prompts_per_step
        while len(groups) < wanted:
            if failure:
                raise RuntimeError(f"rollout worker failed: {failure[0]!r}") from failure[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no full batch within {self.timeout_s}s (have {len(groups)} groups)")
            groups += self.buffer.sample(wanted - len(groups), timeout=0.05)
        return groups

    def _publish(self) -> None:
        # The snapshot is a copy, so its checksum equals the trainer's weights at this
        # version; it is computed lazily by the worker that verifies the load.
        self.weights.publish(self.trainer.version, self.trainer.state_dict())

    def _event(self, worker: str, phase: str, start: float, end: float, cpu: float | None = None) -> None:
        self.recorder.event(worker, phase, start, end, cpu)
