"""Continuous rollout with in-flight weight updates: ``async`` with ``inflight``.

A batch that waits for its longest response holds every finished row's slot idle; with
a long tail of response lengths that is most of the time. Here rollout never stops:

* the engine works on a pool of at most ``capacity`` rows, ``chunk_tokens`` decode steps
  at a time (:meth:`~asyncrlhf.rollout.base.EngineBase.extend`), loading any newer
  published version between decode steps, so a response's tokens may come from several
  versions, each token tagged with its own;
* a row that ends frees its slot at once, and whole groups are admitted as soon as G
  slots are free;
* each group is *reserved* for a trainer step when admitted: the k-th group admitted is
  trained at step k // prompts_per_step, and admitted only once the engine holds a
  version ≥ that step − max_staleness (AReaL's bound on how far generation may run
  ahead, applied at admission). Finished groups are handed on in reservation order, so
  a group's oldest token is never staler than the bound when trained, by construction,
  and no long response is dropped or restarted for being slow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from asyncrlhf.rollout.base import InFlight
from asyncrlhf.rollout.worker import RolloutWorker
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import Experience

__all__ = ["RolloutStream"]


@dataclass
class _Row:
    """One response being generated: its tokens, behaviour log-probs and versions so far."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    versions: torch.Tensor
    done: bool = False


@dataclass
class _Group:
    index: int  # reservation order: trained at step index // prompts_per_step
    problem: Problem
    rows: list[_Row]

    @property
    def done(self) -> bool:
        return all(row.done for row in self.rows)


class RolloutStream:
    """The pool of responses being generated, reserved groups and their hand-off.

    Args:
        worker: the rollout worker (engine, reward, group size, token ids).
        capacity: rows generated at once (at least one group's).
        chunk_tokens: decode steps per engine call between admissions.
        max_new_tokens: the response cap.
    """

    def __init__(self, worker: RolloutWorker, capacity: int, chunk_tokens: int, max_new_tokens: int) -> None:
        if capacity < worker.group_size:
            raise ValueError(f"capacity={capacity} rows cannot hold one group of {worker.group_size}")
        self.worker, self.capacity, self.chunk_tokens = worker, capacity, chunk_tokens
        self.max_new_tokens = max_new_tokens
        self.groups: list[_Group] = []  # admitted, not yet handed on, in reservation order
        self.admitted = 0  # groups reserved so far

    @property
    def active_rows(self) -> int:
        return sum(not row.done for group in self.groups for row in group.rows)

    def admit(self, draw: Callable[[int], list[Problem]], allowed: Callable[[int], bool]) -> int:
        """Reserve new groups while G slots are free and ``allowed(index)`` (the
        staleness bound of the step the group would be trained at); how many."""
        g, added = self.worker.group_size, 0
        while self.active_rows + g <= self.capacity and allowed(self.admitted):
            (problem,) = draw(1)
            empty = torch.zeros(0, dtype=torch.long)
            rows = [_Row(empty, torch.zeros(0), empty) for _ in range(g)]
            self.groups.append(_Group(self.admitted, problem, rows))
            self.admitted += 1
            added += 1
        return added

    def advance(self, inflight: InFlight | None) -> int:
        """Extend every active row by up to ``chunk_tokens`` tokens; tokens generated."""
        active = [(group, row) for group in self.groups for row in group.rows if not row.done]
        if not active:
            return 0
        engine = self.worker.engine
        rows = [(group.problem.prompt_ids, row.tokens) for group, row in active]
        samples = engine.extend(rows, self.chunk_tokens, inflight)  # type: ignore[attr-defined]
        produced = 0
        for (_, row), sample in zip(active, samples, strict=True):
            room = self.max_new_tokens - row.tokens.shape[0]
            new = sample.response_ids[:room].cpu()
            versions = sample.token_versions
            versions = torch.full_like(new, sample.policy_version) if versions is None else versions[:room].cpu()
            row.tokens = torch.cat([row.tokens, new])
            row.logprobs = torch.cat([row.logprobs, sample.logprobs[:room].float().cpu()])
            row.versions = torch.cat([row.versions, versions])
            produced += new.shape[0]
            ended = new.shape[0] > 0 and int(new[-1]) == self.worker.eos_token_id
            row.done = ended or row.tokens.shape[0] >= self.max_new_tokens
        return produced

    def ready(self) -> list[list[Experience]]:
        """The finished groups at the head of the reservation order, rewarded."""
        out = []
        while self.groups and self.groups[0].done:
            group = self.groups.pop(0)
            out.append(self.worker.reward_group(group.problem, group.rows, key=f"g{group.index}"))
        return out

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The pool as plain values and tensors: admitted groups and their rows so far."""
        return {
            "admitted": self.admitted,
            "groups": [
                {
                    "index": group.index,
                    "problem": {f.name: getattr(group.problem, f.name) for f in fields(group.problem)},
                    "rows": [(row.tokens, row.logprobs, row.versions, row.done) for row in group.rows],
                }
                for group in self.groups
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.admitted = int(state["admitted"])
        self.groups = [
            _Group(
                int(group["index"]),
                Problem(**{**group["problem"], "variants": tuple(group["problem"]["variants"])}),
                [_Row(t, lp, v, bool(done)) for t, lp, v, done in group["rows"]],
            )
            for group in state["groups"]
        ]
