"""Held-out evaluation: greedy accuracy on a task's evaluation problems."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrlhf.rewards import exact_match_reward, split_reward
from asyncrlhf.rollout.base import RolloutEngine
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import pad_rows

__all__ = ["EvalCallback", "Evaluation", "evaluate", "evaluate_accuracy", "greedy_engine"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One held-out evaluation: the accuracy and, per problem in order, the greedy
    response's token ids and whether it was correct (for a table of what the policy
    gets right). No problems: NaN accuracy, empty lists."""

    accuracy: float
    responses: list[list[int]]
    correct: list[bool]


EvalCallback = Callable[[int, Evaluation], None]


def evaluate(
    engine: RolloutEngine,
    problems: Sequence[Problem],
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int = 256,
    scorer: Callable[..., Any] | None = None,
) -> Evaluation:
    """Greedy responses to ``problems``; a response is correct when it is exactly the
    answer, then EOS, or, given a ``scorer`` (a reward function: a decoded verifier for
    worked answers), when it scores above 0.5."""
    responses: list[list[int]] = []
    correct: list[bool] = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        samples = engine.generate([p.prompt_ids for p in chunk])
        ids = pad_rows([s.response_ids for s in samples], pad_token_id)  # (B, R)
        answers = [p.patterns_on(ids.device) for p in chunk]
        if scorer is None:
            hits = exact_match_reward(ids, answers, eos_token_id)
        else:
            hits = split_reward(scorer(ids, answers, eos_token_id))[0] > 0.5
        correct += [bool(hit) for hit in hits.tolist()]
        responses += [s.response_ids.tolist() for s in samples]
    accuracy = sum(correct) / len(correct) if correct else float("nan")
    return Evaluation(accuracy, responses, correct)


def evaluate_accuracy(
    engine: RolloutEngine, problems: Sequence[Problem], eos_token_id: int, pad_token_id: int, batch_size: int = 256
) -> float:
    """Share of ``problems`` whose greedy response is exactly the answer, then EOS."""
    return evaluate(engine, problems, eos_token_id, pad_token_id, batch_size).accuracy


def greedy_engine(
    model: Any, eos_token_id: int, pad_token_id: int, max_new_tokens: int, stop: Callable[..., bool] | None = None
) -> RolloutEngine:
    """A greedy engine that shares ``model`` (no copy): evaluates the live policy (``stop``:
    see :class:`~asyncrlhf.rollout.HFEngine`)."""
    from asyncrlhf.rollout.base import Sampling
    from asyncrlhf.rollout.hf import HFEngine

    return HFEngine(
        model,
        eos_token_id,
        pad_token_id,
        sampling=Sampling(max_new_tokens=max_new_tokens, temperature=0.0),
        copy=False,
        stop=stop,
    )
