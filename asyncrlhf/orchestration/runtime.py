"""What every runtime is: the :class:`Runtime` protocol, the :class:`RunConfig` it is
built from, and :class:`RuntimeBase`, the behaviour they share.

A runtime runs one experiment's loop, rollout and training, in its own way: the
in-process :class:`~asyncrlhf.orchestration.Orchestrator` (threads) and the Ray
:class:`~asyncrlhf.distributed.RayOrchestrator` (actors). The pipelines layer talks to
a :class:`Runtime` only: run, checkpoint, restore, the policy's weights, the buffer's
counters, close. What differs between runtimes is how a batch is generated and where
the trainer lives; what a run is (the schedule, the problem stream, the record, the
start and the end, what a checkpoint holds besides the runtime's own state) lives here.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from asyncrlhf._checks import check_positive_int
from asyncrlhf.orchestration.evaluate import EvalCallback, Evaluation
from asyncrlhf.orchestration.history import RunHistory
from asyncrlhf.orchestration.record import MetricsCallback, StepRecorder
from asyncrlhf.orchestration.schedule import Schedule
from asyncrlhf.rollout.worker import EventSink, RolloutWorker
from asyncrlhf.tasks.base import Problem

__all__ = ["AfterStep", "HeldOut", "RunConfig", "Runtime", "RuntimeBase"]

AfterStep = Callable[[int], None]
RewardFn = Callable[[torch.Tensor, Any, int], torch.Tensor]


@dataclass(frozen=True)
class HeldOut:
    """The held-out evaluation: greedy responses to ``problems``, at most
    ``max_new_tokens`` long, judged by ``scorer`` (a reward function, correct above
    0.5; None: exact match on tokens). No problems: accuracy is NaN."""

    problems: list[Problem] = field(default_factory=list)
    max_new_tokens: int = 16
    scorer: Callable[..., Any] | None = None


@dataclass(frozen=True)
class RunConfig:
    """Everything a runtime needs besides its engines and trainer.

    Args:
        schedule: mode, group size, prompts per step, staleness bound, lag, cadences.
        problems: the training problems (an iterator; deterministic, so a restored run
            replays it to where the checkpoint left it).
        reward_fn: ``fn(generated_ids, answers, eos_token_id) -> Tensor[B]``.
        eos_token_id, pad_token_id: of the tokenizer.
        held_out: the held-out evaluation.
        advantage: the advantage estimator (a registered name, see
            :mod:`asyncrlhf.advantages`), applied to each trainer batch.
        verify_weights: check weight checksums after every load.
        timeout_s: how long any wait may last before the run fails loudly.
        on_metrics: ``callback(step, metrics)`` after every trainer step; step 0 carries
            the evaluation before any update (``eval/accuracy``).
        on_eval: ``callback(step, evaluation)`` after every held-out evaluation.
    """

    schedule: Schedule
    problems: Iterator[Problem]
    reward_fn: RewardFn
    eos_token_id: int
    pad_token_id: int
    held_out: HeldOut = field(default_factory=HeldOut)
    advantage: str = "grpo"
    verify_weights: bool = True
    timeout_s: float = 600.0
    on_metrics: MetricsCallback | None = None
    on_eval: EvalCallback | None = None

    def for_trainer(self) -> RunConfig:
        """The part a trainer process needs: no problem stream, no callbacks (which
        stay with the driver), so it pickles."""
        return dataclasses.replace(self, problems=iter(()), on_metrics=None, on_eval=None)

    def rollout_worker(self, engine: Any, name: str, on_event: EventSink) -> RolloutWorker:
        """A rollout worker for ``engine``, generating this run's groups."""
        return RolloutWorker(
            engine,
            self.reward_fn,
            self.schedule.group_size,
            self.eos_token_id,
            self.pad_token_id,
            self.verify_weights,
            name,
            on_event,
        )


@runtime_checkable
class Runtime(Protocol):
    """One way to run an experiment's loop. Built, then optionally :meth:`restore`-d,
    then :meth:`run` once, then :meth:`close`-d."""

    def run(self, num_steps: int, after_step: AfterStep | None = None) -> RunHistory:
        """Train until ``num_steps`` trainer steps are done (counting those before a
        restore); ``after_step(steps_done)`` runs after every step (a checkpoint, a stop)."""
        ...

    def checkpoint(self, write: Callable[[dict[str, Any]], None]) -> None:
        """Call ``write(state)`` with the whole run state at a step boundary (from ``after_step``)."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Put a :meth:`checkpoint`'s state back, before :meth:`run`."""
        ...

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The trained policy's weights."""
        ...

    def adapter(self) -> dict[str, Any] | None:
        """With LoRA: the adapter's ``peft`` config and weights (see ``TrainerWorker.adapter``); else None."""
        ...

    def buffer_stats(self) -> dict[str, int]:
        """The trainer's buffer counters (pushed, sampled, dropped, evicted, size)."""
        ...

    def close(self) -> None:
        """Release what the runtime holds (processes, pools); safe to call twice."""
        ...


class RuntimeBase:
    """The run as every runtime has it: its config, record and problem stream, the
    start (first publish, evaluation before any update, the clock), the end (the
    summary), and the shared half of checkpoint and restore.

    A runtime implements the hooks: :meth:`_publish_initial`, :meth:`_evaluate`,
    :meth:`_loop`, :meth:`_pause` / :meth:`_own_state` / :meth:`_load_own_state` for checkpoints, and
    :meth:`_workers`; it may add :meth:`_ready` (wait for its workers) and
    :meth:`_summary` (extra run figures).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.schedule = config.schedule
        self.problems = config.problems
        self.timeout_s = config.timeout_s
        self.recorder = StepRecorder(self.schedule.mode, config.on_metrics, config.on_eval)
        self._drawn = 0  # problems taken from the stream
        self._restored = False

    # ------------------------------------------------------------------ run
    def run(self, num_steps: int, after_step: AfterStep | None = None) -> RunHistory:
        """Train until ``num_steps`` trainer steps are done (counting those before a
        :meth:`restore`); returns the run's history. A run restored at its end (stopped
        during its final upload) trains nothing."""
        check_positive_int("num_steps", num_steps)
        if not self._restored:
            self._publish_initial()
        self._ready()
        if self.schedule.eval_every and not self._restored:
            self.recorder.initial(self._evaluate())
        self.recorder.begin(keep_elapsed=self._restored)
        first = self.recorder.steps_done
        if first < num_steps:
            self._loop(first, num_steps, after_step)
        return self.recorder.finish(self._workers(), self._summary())

    def draw(self, n: int) -> list[Problem]:
        """The next ``n`` training problems."""
        problems = [next(self.problems) for _ in range(n)]
        self._drawn += n
        return problems

    # ---------------------------------------------------------- checkpoints
    def checkpoint(self, write: Callable[[dict[str, Any]], None]) -> None:
        """Call ``write(state)`` with the whole run state after the last finished step;
        the runtime holds still meanwhile, so the state is consistent while written.

        Folders the state names in ``state["attachments"]`` (a trainer group's shards)
        are temporary: ``write`` moves or copies them; what is left is removed after it."""
        with self._pause():
            state = self._own_state()
            state["steps_done"] = self.recorder.steps_done
            state["record"] = self.recorder.state_dict()
            state.setdefault("rollout", {})["problems_drawn"] = self._drawn_at_checkpoint()
            made = [Path(folder) for folder in state.get("attachments", {}).values()]
            try:
                write(state)
            finally:
                for folder in made:
                    shutil.rmtree(folder, ignore_errors=True)

    def restore(self, state: dict[str, Any]) -> None:
        """Put a :meth:`checkpoint` back, before :meth:`run` (on a freshly built runtime)."""
        if self._restored or self.recorder.steps_done:
            raise RuntimeError("restore() needs a freshly built runtime that has not run")
        self._load_own_state(state)
        drawn = int(state["rollout"]["problems_drawn"])
        for _ in range(drawn):  # the stream is deterministic: replay it
            next(self.problems)
        self._drawn = drawn
        self.recorder.load_state_dict(state["record"])
        self._restored = True

    def close(self) -> None:
        """Close the reward's resources (a decoded reward's process pool)."""
        close = getattr(self.config.reward_fn, "close", None)
        if close is not None:
            close()

    # ----------------------------------------------------------------- hooks
    def _publish_initial(self) -> None:
        raise NotImplementedError

    def _ready(self) -> None:
        """Wait until every worker is up (before the clock starts)."""

    def _evaluate(self) -> Evaluation:
        raise NotImplementedError

    def _loop(self, first: int, num_steps: int, after_step: AfterStep | None) -> None:
        raise NotImplementedError

    def _pause(self) -> Any:
        """A context in which no step runs and no batch is generated."""
        raise NotImplementedError

    def _own_state(self) -> dict[str, Any]:
        """The runtime's own part of a checkpoint (trainer, buffer, published weights…)."""
        raise NotImplementedError

    def _load_own_state(self, state: dict[str, Any]) -> None:
        """Put the runtime's own part of a checkpoint back."""
        raise NotImplementedError

    def _drawn_at_checkpoint(self) -> int:
        """Problems a restored run skips: those drawn so far (a runtime that drops its
        in-flight batches on restore counts only the trained ones)."""
        return self._drawn

    def _workers(self) -> list[str]:
        raise NotImplementedError

    def _summary(self) -> dict[str, float]:
        return {}
