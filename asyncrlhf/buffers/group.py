"""Group-aware replay buffer for GRPO: whole groups of G completions per prompt."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from asyncrlhf._checks import check_positive_int
from asyncrlhf.advantages import Estimator, get_advantage
from asyncrlhf.buffers.base import LockedBuffer, StalenessRule
from asyncrlhf.types import Experience

__all__ = ["GroupAwareReplayBuffer"]


class GroupAwareReplayBuffer(LockedBuffer):
    """Collects ``group_size`` experiences per ``prompt_id``; serves complete groups.

    When a prompt's G-th experience arrives, the group's advantages are computed with
    the ``advantage`` estimator (GRPO's :func:`~asyncrlhf.losses.group_advantages` by
    default) and written to each experience's ``advantage``; the group then moves to
    the ready queue (at most ``max_groups``; overflow drops the oldest ready group).
    Prompts may interleave freely; at most ``max_groups`` groups wait incomplete too (a
    prompt whose group never completes would be held forever): a new prompt beyond that
    drops the oldest incomplete group, counted in ``dropped_overflow``.

    With ``max_staleness`` (and a ``version`` source), stale experiences are refused at
    push, and a group is evicted whole — pending or ready — once its oldest member is
    staler than the bound.

    Counters are in experiences; ``len(buffer)`` is the number of experiences held
    (pending plus ready), so ``pushed == sampled + dropped_overflow + evicted_stale +
    len`` as for every buffer. ``num_ready_groups`` counts groups ready to sample.

    Args:
        group_size: G, completions per prompt.
        max_groups: capacity of the ready queue, in groups.
        max_staleness: the largest τ accepted, or None for no staleness bound.
        version: VersionManager or zero-arg callable; required with ``max_staleness``.
        advantage: the estimator applied to each group as it completes (a registered
            name or :class:`~asyncrlhf.advantages.Estimator`), or None to leave
            advantages to the consumer (a runtime applies its estimator to the whole
            trainer batch, so that batch-level ones such as REINFORCE++ work).
    """

    def __init__(
        self,
        group_size: int,
        max_groups: int = 1024,
        max_staleness: int | None = None,
        version: object | None = None,
        advantage: str | Estimator | None = "grpo",
    ) -> None:
        super().__init__()
        self.group_size = check_positive_int("group_size", group_size)
        self.max_groups = check_positive_int("max_groups", max_groups)
        if max_staleness is not None and version is None:
            raise ValueError("version is required when max_staleness is set")
        self._rule = None if max_staleness is None else StalenessRule(max_staleness, version)
        self.advantage = None if advantage is None else get_advantage(advantage)
        self._pending: dict[Hashable, list[Experience]] = {}
        self._pending_count = 0
        self._ready: deque[list[Experience]] = deque()

    @property
    def max_staleness(self) -> int | None:
        return None if self._rule is None else self._rule.max_staleness

    def push(self, exp: Experience) -> bool:
        """Add ``exp`` to its prompt's group; True if accepted."""
        if not isinstance(exp, Experience):
            raise TypeError(f"exp must be an Experience, got {type(exp).__name__}")
        with self._cond:
            self._pushed += 1
            if self._rule is not None and self._rule.too_stale(exp.policy_version, self._rule.current()):
                self._evicted_stale += 1
                return False
            group = self._pending.get(exp.prompt_id)
            if group is None:
                if len(self._pending) >= self.max_groups:
                    oldest = self._pending.pop(next(iter(self._pending)))
                    self._pending_count -= len(oldest)
                    self._dropped_overflow += len(oldest)
                group = self._pending[exp.prompt_id] = []
            group.append(exp)
            self._pending_count += 1
            if len(group) == self.group_size:
                del self._pending[exp.prompt_id]
                self._pending_count -= self.group_size
                self._complete(group)
                self._notify()
            return True

    def sample(self, num_groups: int, timeout: float | None = None) -> list[list[Experience]]:
        """Remove and return up to ``num_groups`` of the oldest complete groups."""
        return self._wait_and_take(check_positive_int("num_groups", num_groups), timeout)

    @property
    def num_ready_groups(self) -> int:
        with self._cond:
            return len(self._ready)

    def __len__(self) -> int:
        with self._cond:
            return self._pending_count + len(self._ready) * self.group_size

    def stats(self) -> dict[str, int]:
        with self._cond:
            out = self._counters(self._pending_count + len(self._ready) * self.group_size)
            out["pending"] = self._pending_count
            out["ready_groups"] = len(self._ready)
            return out

    def state_dict(self) -> dict[str, Any]:
        """What the buffer holds (pending and ready groups, in order) and its accounting,
        for a checkpoint; :meth:`load_state_dict` restores it into an empty buffer."""
        with self._cond:
            return {
                "counters": self._counter_state(),
                "pending": [[exp.state_dict() for exp in group] for group in self._pending.values()],
                "ready": [[exp.state_dict() for exp in group] for group in self._ready],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            if self._pushed or self._pending or self._ready:
                raise RuntimeError("load_state_dict needs an empty, unused buffer")
            self._restore_counters(state["counters"])
            for group in state["pending"]:
                experiences = [Experience.from_state(e) for e in group]
                self._pending[experiences[0].prompt_id] = experiences
                self._pending_count += len(experiences)
            self._ready.extend([Experience.from_state(e) for e in group] for group in state["ready"])

    # Called with the lock held.
    def _units(self, out: list[list[Experience]]) -> int:
        return sum(len(group) for group in out)

    def _complete(self, group: list[Experience]) -> None:
        if self.advantage is not None:  # G host floats: no tensor overhead under the lock
            (advantages,) = self.advantage([[e.reward for e in group]])
            for exp, adv in zip(group, advantages, strict=True):
                exp.advantage = adv
        if len(self._ready) >= self.max_groups:
            self._dropped_overflow += len(self._ready.popleft())
        self._ready.append(group)

    def _stale(self, group: list[Experience], current: int) -> bool:
        assert self._rule is not None
        return self._rule.too_stale(min(e.policy_version for e in group), current)

    def _recheck(self, out: list[list[Experience]]) -> None:
        if self._rule is None:
            return
        current = self._rule.current()
        kept = [group for group in out if not self._stale(group, current)]
        self._evicted_stale += self._units(out) - self._units(kept)
        out[:] = kept

    def _take(self, out: list[list[Experience]], num_groups: int) -> None:
        if self._rule is not None:
            current = self._rule.current()
            for prompt_id in [p for p, g in self._pending.items() if self._stale(g, current)]:
                group = self._pending.pop(prompt_id)
                self._pending_count -= len(group)
                self._evicted_stale += len(group)
        while self._ready and len(out) < num_groups:
            group = self._ready.popleft()
            if self._rule is not None and self._stale(group, current):
                self._evicted_stale += len(group)
            else:
                out.append(group)
