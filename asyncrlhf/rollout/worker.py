"""The rollout worker: problems in, rewarded and version-tagged experiences out.

Each batch samples ``group_size`` completions of each problem, scores them with the
reward function on the tokens' device, and tags every experience with the policy
version of the weights that generated it. Which weights a batch may use, and where its
experiences go, is the runtime's business (:mod:`asyncrlhf.orchestration.schedule`):
the same worker runs in a thread of the in-process runtime and inside each Ray
rollout actor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from asyncrlhf._checks import check_positive_int
from asyncrlhf._clock import clock
from asyncrlhf.rewards.registry import split_reward
from asyncrlhf.rollout.base import InFlight, RolloutEngine, Sample
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import Experience, pad_rows

__all__ = ["RolloutWorker"]

# (worker, phase, start, end, cpu): wall-clock time.time() seconds, and the phase's thread CPU seconds
EventSink = Callable[[str, str, float, float, float], None]


class RolloutWorker:
    """Loads published weights (verified), generates, rewards and tags experiences.

    Args:
        engine: any rollout engine.
        reward_fn: ``fn(generated_ids, answers, eos_token_id) -> Tensor[B]``.
        group_size: G completions per prompt.
        eos_token_id, pad_token_id: of the engine's tokenizer.
        verify_weights: check the engine's weight checksum after every load.
        name: the worker's name in the timeline.
        on_event: receives (worker, phase, start, end, cpu) timeline events (wall-clock
            start and end, the phase's thread CPU seconds).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        reward_fn: Callable[[torch.Tensor, Any, int], torch.Tensor],
        group_size: int,
        eos_token_id: int,
        pad_token_id: int,
        verify_weights: bool = True,
        name: str = "rollout-0",
        on_event: EventSink | None = None,
    ) -> None:
        self.engine = engine
        self.reward_fn = reward_fn
        self.group_size = check_positive_int("group_size", group_size)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.verify_weights = verify_weights
        self.name = name
        self.on_event = on_event
        self.weight_loads = 0

    def event(self, phase: str, start: tuple[float, float]) -> None:
        """Record ``phase`` from ``start`` (``clock()``'s wall and thread-CPU times) to now."""
        if self.on_event is not None:
            self.on_event(self.name, phase, start[0], time.time(), time.thread_time() - start[1])

    def load_snapshot(self, snapshot: Any) -> str:
        """Load a published snapshot (``.version``, ``.weights``, ``.checksum``) into the
        engine and, with ``verify_weights``, check the engine's checksum against it.

        Returns the checksum the engine holds after the load.
        """
        start = clock()
        self.engine.load_weights(snapshot.weights, snapshot.version)
        held = self.engine.checksum() if self.verify_weights else snapshot.checksum
        if held != snapshot.checksum:
            raise RuntimeError(
                f"{self.name}: weight checksum after loading {held[:12]} != trainer's {snapshot.checksum[:12]} "
                f"at version {snapshot.version}"
            )
        self.weight_loads += 1
        self.event("load_weights", start)
        return held

    def generate_batch(self, problems: list[Problem], key: str, inflight: InFlight | None = None) -> list[Experience]:
        """One batch: ``group_size`` rewarded experiences for each problem; the group of
        problem i is keyed ``{key}:{i}`` (``key`` must be unique within the run).
        ``inflight``: weight updates between decode steps (each token keeps its version)."""
        start = clock()
        prompts = [p.prompt_ids for p in problems]
        samples = (
            self.engine.generate(prompts, self.group_size, inflight)
            if inflight
            else self.engine.generate(prompts, self.group_size)
        )
        self.event("generate", start)
        return self.score(problems, samples, key)

    def reward_group(self, problem: Problem, rows: list[Any], key: str) -> list[Experience]:
        """One group generated row by row (a continuous rollout's ``rows``, each with its
        ``tokens``, ``logprobs`` and per-token ``versions``), rewarded, keyed ``{key}:0``."""
        samples = []
        for row in rows:
            oldest = int(row.versions.min())
            mixed = int(row.versions.max()) != oldest
            samples.append(
                Sample(0, problem.prompt_ids, row.tokens, row.logprobs, oldest, row.versions if mixed else None)
            )
        return self.score([problem], samples, key)

    def score(self, problems: list[Problem], samples: list[Sample], key: str) -> list[Experience]:
        """Reward ``samples`` (of ``problems[s.prompt_index]``) on the tokens' device and
        make them experiences, the group of problem i keyed ``{key}:{i}``."""
        start = clock()
        responses = [s.response_ids for s in samples]
        ids = pad_rows(responses, self.pad_token_id)  # (B·G, R)
        answers = [problems[s.prompt_index].patterns_on(ids.device) for s in samples]
        scores, flags = split_reward(self.reward_fn(ids, answers, self.eos_token_id))
        # A non-finite score (NaN, ±inf) is an error of that row, counted as reward/nonfinite
        # and scored 0: it must neither fail the run nor reach its group's advantages.
        finite = torch.isfinite(scores)
        scores = torch.where(finite, scores, torch.zeros_like(scores))
        flags["nonfinite"] = (~finite).to(scores.dtype)
        rewards = scores.tolist()  # one transfer per batch
        rows = {name: values.tolist() for name, values in flags.items()}
        experiences = [
            Experience(
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                logprobs=s.logprobs,
                reward=reward,
                policy_version=s.policy_version,
                prompt_id=f"{key}:{s.prompt_index}",
                reward_flags={name: values[i] for name, values in rows.items()},
                token_versions=s.token_versions,
            )
            for i, (s, reward) in enumerate(zip(samples, rewards, strict=True))
        ]
        self.event("reward", start)
        return experiences
