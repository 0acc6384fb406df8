"""The rollout worker: prompts in, rewarded and version-tagged experiences out.

Each batch takes ``prompts_per_batch`` problems, samples ``group_size`` completions of
each, scores them with the reward function on the tokens' device, tags every
experience with the policy version of the weights that generated it, and pushes them
to the buffer.

Before batch n the worker loads the weights it is allowed to use (``WeightPolicy``):
the trainer consumes one batch per version, so batch n is trained at version ≥ n and
generating it with weights older than n − max_staleness would produce data that is
already too stale. The worker waits for fresh enough weights instead (AReaL's
``max_head_offpolicyness``): no compute is spent on data the buffer would evict.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from asyncrlhf._checks import check_nonnegative_int, check_positive_int
from asyncrlhf.buffers.base import ReplayBuffer
from asyncrlhf.rollout.base import RolloutEngine
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import Experience, pad_rows

__all__ = ["RolloutWorker", "WeightPolicy"]

# (worker, phase, start, end) in time.perf_counter() seconds
EventSink = Callable[[str, str, float, float], None]


@dataclass(frozen=True)
class WeightPolicy:
    """Which weights batch n must be generated with.

    ``exact``: exactly version max(0, n − lag) (``sync`` is lag 0; ``lagged`` is lag k).
    ``bounded``: the newest published version, at least n − max_staleness (``async``).
    """

    kind: Literal["exact", "bounded"]
    lag: int = 0
    max_staleness: int = 0

    def required_version(self, batch_index: int) -> int:
        slack = self.lag if self.kind == "exact" else self.max_staleness
        return max(0, batch_index - slack)


class RolloutWorker:
    """Generates, rewards, tags and pushes experiences; pauses rather than go stale.

    Args:
        engine: any rollout engine.
        problems: an iterator of task problems.
        reward_fn: ``fn(generated_ids, answers, eos_token_id) -> Tensor[B]``.
        buffer: where experiences go.
        group_size: G completions per prompt.
        prompts_per_batch: prompts per generation call (one trainer batch).
        eos_token_id, pad_token_id: of the engine's tokenizer.
        weights: a WeightStore to pull weights from (None: never reload).
        policy: which weights each batch needs (see :class:`WeightPolicy`).
        verify_sync: check the engine's weight checksum after every load.
        name: the worker's name in the timeline.
        on_event: receives (worker, phase, start, end) timeline events.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        problems: Iterator[Problem],
        reward_fn: Callable[[torch.Tensor, Any, int], torch.Tensor],
        buffer: ReplayBuffer,
        group_size: int,
        prompts_per_batch: int,
        eos_token_id: int,
        pad_token_id: int,
        weights: Any | None = None,
        policy: WeightPolicy = WeightPolicy("exact"),
        verify_sync: bool = True,
        name: str = "rollout-0",
        on_event: EventSink | None = None,
    ) -> None:
        self.engine = engine
        self.problems = problems
        self.reward_fn = reward_fn
        self.buffer = buffer
        self.group_size = check_positive_int("group_size", group_size)
        self.prompts_per_batch = check_positive_int("prompts_per_batch", prompts_per_batch)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.weights = weights
        self.policy = policy
        self.verify_sync = verify_sync
        self.name = name
        self.on_event = on_event
        self.batches = 0
        self.generated_tokens = 0
        self.weight_loads = 0
        self._prompt_counter = itertools.count()

    def _event(self, phase: str, start: float) -> None:
        if self.on_event is not None:
            self.on_event(self.name, phase, start, time.perf_counter())

    def sync_weights(self, batch_index: int, timeout: float | None = None, force: bool = False) -> None:
        """Load the weights ``batch_index`` needs, waiting for them if not yet published.

        ``force`` loads (and verifies) even when the engine claims the right version:
        done once at the start of a run, so initial weights are checked too.
        """
        if self.weights is None:
            return
        needed = self.policy.required_version(check_nonnegative_int("batch_index", batch_index))
        if not force and self.policy.kind == "exact" and self.engine.version == needed:
            return
        start = time.perf_counter()
        if self.policy.kind == "exact":
            snapshot = self.weights.exact(needed, timeout)
        else:
            snapshot = self.weights.at_least(needed, timeout)
        self._event("wait", start)
        if not force and snapshot.version == self.engine.version:
            return
        self.load_snapshot(snapshot)

    def load_snapshot(self, snapshot: Any) -> str:
        """Load a published snapshot (``.version``, ``.weights``, ``.checksum``) into the
        engine and, with ``verify_sync``, check the engine's checksum against it.

        Returns the checksum the engine holds after the load.
        """
        start = time.perf_counter()
        self.engine.load_weights(snapshot.weights, snapshot.version)
        held = self.engine.checksum() if self.verify_sync else snapshot.checksum
        if held != snapshot.checksum:
            raise RuntimeError(
                f"{self.name}: weight checksum after sync {held[:12]} != trainer's {snapshot.checksum[:12]} "
                f"at version {snapshot.version}"
            )
        self.weight_loads += 1
        self._event("load_weights", start)
        return held

    def generate_batch(self, problems: list[Problem] | None = None, key_prefix: str | None = None) -> list[Experience]:
        """One batch: ``group_size`` rewarded experiences for each problem.

        ``problems`` defaults to the next ``prompts_per_batch`` of the worker's stream.
        Group keys are ``{key_prefix}:{i}``; by default the worker's name and a running
        count, which are unique within the worker.
        """
        if problems is None:
            problems = [next(self.problems) for _ in range(self.prompts_per_batch)]
        start = time.perf_counter()
        samples = self.engine.generate([p.prompt_ids for p in problems], self.group_size)
        self._event("generate", start)

        start = time.perf_counter()
        responses = [s.response_ids for s in samples]
        ids = pad_rows(responses, self.pad_token_id)  # (B·G, R)
        answers = [problems[s.prompt_index].answer_ids.to(ids.device) for s in samples]
        rewards = self.reward_fn(ids, answers, self.eos_token_id).tolist()  # one transfer per batch
        if key_prefix is None:
            keys = [f"{self.name}:{next(self._prompt_counter)}" for _ in problems]  # unique group keys
        else:
            keys = [f"{key_prefix}:{i}" for i in range(len(problems))]
        experiences = [
            Experience(
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                logprobs=s.logprobs,
                reward=reward,
                policy_version=s.policy_version,
                prompt_id=keys[s.prompt_index],
                metadata={"problem": problems[s.prompt_index].prompt_id},
            )
            for s, reward in zip(samples, rewards, strict=True)
        ]
        self._event("reward", start)
        self.batches += 1
        self.generated_tokens += sum(r.shape[0] for r in responses)
        return experiences

    def step(self, batch_index: int | None = None, timeout: float | None = None) -> int:
        """Sync weights for the batch, generate it, push it; returns how many were accepted."""
        self.sync_weights(self.batches if batch_index is None else batch_index, timeout)
        experiences = self.generate_batch()
        return sum(bool(self.buffer.push(e)) for e in experiences)
