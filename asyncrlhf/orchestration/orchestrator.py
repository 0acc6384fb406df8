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

Checkpoints: :meth:`Orchestrator.checkpoint` captures the whole run state between two
steps (trainer, buffer, published-weights ring, the engine's sampling stream, the prompt
stream's position, the record) with the rollout thread paused between batches;
:meth:`Orchestrator.restore` puts it back before :meth:`Orchestrator.run`, which then
continues at the next step: exactly as the uninterrupted run in ``sync`` and ``lagged``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from asyncrlhf._checks import check_positive_int
from asyncrlhf.orchestration.evaluate import EvalCallback
from asyncrlhf.orchestration.history import RunHistory
from asyncrlhf.orchestration.schedule import MODES, MetricsCallback, Schedule, StepRecorder, TrainerSide
from asyncrlhf.orchestration.weights import WeightStore, WeightStoreClosed
from asyncrlhf.rollout.base import RolloutEngine
from asyncrlhf.rollout.worker import RolloutWorker
from asyncrlhf.tasks.base import Problem
from asyncrlhf.training.trainer import TrainerWorker
from asyncrlhf.types import Experience

__all__ = ["MODES", "Orchestrator", "Schedule"]


class Orchestrator:
    """Joins a rollout engine and a trainer through a group-aware, version-aware buffer.

    Args:
        engine: the rollout engine (its weights are replaced from the trainer's).
        trainer: the trainer (owns the policy being optimised).
        problems: training problems (an iterator).
        reward_fn: ``fn(generated_ids, answers, eos_token_id) -> Tensor[B]``.
        eos_token_id, pad_token_id: of the tokenizer.
        schedule: mode, group size, prompts per step, staleness bound, lag, cadences.
        eval_problems: held-out problems for greedy accuracy.
        max_new_tokens: response cap of the greedy evaluation (default: the engine's).
        scale_advantages: GRPO's std scaling (False: Dr. GRPO).
        verify_weights: check weight checksums after every load.
        on_metrics: ``callback(step, metrics)`` after every trainer step; step 0 carries the
            evaluation before any update (``eval/accuracy``), sent when measured.
        on_eval: ``callback(step, evaluation)`` after every held-out evaluation (step 0
            included): the greedy responses and which were correct.
        eval_scorer: judges held-out responses (a reward function, e.g. a decoded
            verifier; correct above 0.5); default: exact match on tokens.
        timeout_s: how long any wait may last before the run fails loudly.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        trainer: TrainerWorker,
        problems: Iterator[Problem],
        reward_fn: Callable[[torch.Tensor, Any, int], torch.Tensor],
        eos_token_id: int,
        pad_token_id: int,
        schedule: Schedule,
        eval_problems: list[Problem] | None = None,
        max_new_tokens: int | None = None,
        scale_advantages: bool = True,
        verify_weights: bool = True,
        on_metrics: MetricsCallback | None = None,
        timeout_s: float = 600.0,
        on_eval: EvalCallback | None = None,
        eval_scorer: Callable[..., Any] | None = None,
    ) -> None:
        self.schedule = schedule
        self.engine, self.trainer, self.problems = engine, trainer, problems
        self.on_metrics, self.on_eval = on_metrics, on_eval
        self.timeout_s = timeout_s
        self.weights = WeightStore(keep=schedule.keep)
        self.recorder = StepRecorder(schedule.mode, on_metrics, on_eval)
        self.worker = RolloutWorker(
            engine, reward_fn, schedule.group_size, eos_token_id, pad_token_id, verify_weights,
            on_event=self._event,
        )  # fmt: skip
        max_new = max_new_tokens or getattr(engine, "max_new_tokens", 16)
        self.trainer_side = TrainerSide(
            trainer, schedule, self._publish, self._event, eval_problems or [], eos_token_id, pad_token_id, max_new,
            scale_advantages, eval_scorer,
        )  # fmt: skip
        self.buffer = self.trainer_side.buffer
        self.versions = self.trainer_side.versions
        self._rollout_lock = threading.Lock()  # held while a batch is generated and pushed
        self._next_batch = 0  # the next batch the rollout side generates
        self._drawn = 0  # problems taken from the stream
        self._restored = False
        self._force_load = True  # the first load is verified even if the engine claims the version

    # ------------------------------------------------------------------ run
    def run(self, num_steps: int, after_step: Callable[[int], None] | None = None) -> RunHistory:
        """Train until ``num_steps`` trainer steps are done (counting those before a
        :meth:`restore`); returns the run's history. ``after_step(steps_done)`` runs in
        the trainer's thread after every step (a checkpoint, a stop request)."""
        check_positive_int("num_steps", num_steps)
        if not self._restored:
            self.recorder = StepRecorder(self.schedule.mode, self.on_metrics, self.on_eval)
            self.trainer_side.publish()
        if self.schedule.eval_every and not self._restored:
            self.recorder.initial(self.trainer_side.evaluate())
        self.recorder.begin(keep_elapsed=self._restored)
        first = self.recorder.steps_done
        if first >= num_steps:
            pass  # restored at its end (a run whose final upload is being finished): nothing to train
        elif self.schedule.mode == "sync":
            for step in range(first, num_steps):
                self._rollout(step)
                self._train(step, after_step)
        else:
            self._run_concurrently(first, num_steps, after_step)
        return self.recorder.finish([self.worker.name])

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The trained policy's weights (a copy)."""
        return self.trainer.state_dict()

    # ---------------------------------------------------------- checkpoints
    def checkpoint(self, write: Callable[[dict[str, Any]], None]) -> None:
        """Call ``write(state)`` with the whole run state, between two trainer steps (call
        it from ``after_step``); the rollout side waits between batches meanwhile, so the
        state is consistent and unchanged while it is written."""
        with self._rollout_lock:
            write({
                "steps_done": self.recorder.steps_done,
                "trainer": self.trainer.state(),
                "buffer": self.buffer.state_dict(),
                "weights": self.weights.state_dict(),
                "engine": {"version": self.engine.version, "rng": self.engine.rng_state()},
                "rollout": {"next_batch": self._next_batch, "problems_drawn": self._drawn},
                "record": self.recorder.state_dict(),
            })  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Put a :meth:`checkpoint` back, before :meth:`run` (on a freshly built run)."""
        if self._restored or self.recorder.steps_done:
            raise RuntimeError("restore() needs a freshly built orchestrator that has not run")
        self.trainer.restore(state["trainer"])
        self.buffer.load_state_dict(state["buffer"])
        self.weights.load_state_dict(state["weights"])
        self.engine.set_rng_state(state["engine"]["rng"])
        self._next_batch = int(state["rollout"]["next_batch"])
        for _ in range(int(state["rollout"]["problems_drawn"])):  # the stream is deterministic: replay it
            next(self.problems)
        self._drawn = int(state["rollout"]["problems_drawn"])
        self.recorder.load_state_dict(state["record"])
        self._restored = True

    def _run_concurrently(self, first: int, num_steps: int, after_step: Callable[[int], None] | None) -> None:
        stop = threading.Event()
        failure: list[BaseException] = []

        def rollout() -> None:
            try:
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
        """Wait until the weights batch ``batch`` may use are published (unless held)."""
        if not self._holds(batch):
            start = time.time()
            self.weights.wait(self.schedule.required_version(batch), self.schedule.exact, self.timeout_s)
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
            problems = [next(self.problems) for _ in range(self.schedule.prompts_per_step)]
            self._drawn += len(problems)
            experiences = self.worker.generate_batch(problems, key=f"b{batch}")
            self.recorder.tokens += sum(e.response_ids.shape[0] for e in experiences)
            for experience in experiences:
                self.buffer.push(experience)
            self._next_batch = batch + 1

    # ------------------------------------------------------------- trainer
    def _train(
        self, step: int, after_step: Callable[[int], None] | None, failure: list[BaseException] | None = None
    ) -> None:
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
