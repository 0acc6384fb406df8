"""Multi-digit addition: ``"37+45="`` → ``"82"``. Verifiable, seeded, with a held-out set."""

from __future__ import annotations

import random
from collections.abc import Iterator

from asyncrlhf._checks import check_nonnegative_int, check_positive_int
from asyncrlhf.tasks.base import Problem, encode_problem

__all__ = ["AdditionTask"]


class AdditionTask:
    """Sums of two numbers of up to ``digits`` digits.

    The evaluation set is drawn from its own seeded generator and its pairs are never
    served for training, so held-out accuracy measures generalisation. Runs that differ
    only in ``seed`` are scored on the same problems (``eval_seed`` fixed), so their
    spread is the RL run's, not the eval draw's.

    Args:
        tokenizer: a tokenizer knowing the digits, ``+`` and ``=``.
        digits: maximum number of digits per operand.
        seed: seeds the training stream.
        eval_size: held-out problems (capped at a quarter of all pairs).
        eval_seed: seeds the held-out draw (None: ``seed``).
    """

    def __init__(
        self, tokenizer: object, digits: int = 2, seed: int = 0, eval_size: int = 200, eval_seed: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.digits = check_positive_int("digits", digits)
        self.seed = check_nonnegative_int("seed", seed)
        self.eval_seed = seed if eval_seed is None else check_nonnegative_int("eval_seed", eval_seed)
        check_nonnegative_int("eval_size", eval_size)
        self.limit = 10**digits
        total = self.limit * self.limit
        rng = random.Random(self.eval_seed)
        eval_count = min(eval_size, total // 4)
        self._eval_pairs = [divmod(i, self.limit) for i in rng.sample(range(total), eval_count)]
        self._held_out = set(self._eval_pairs)

    def problem(self, a: int, b: int) -> Problem:
        return encode_problem(self.tokenizer, f"{a}+{b}", f"{a}+{b}=", str(a + b))

    def train_problems(self) -> Iterator[Problem]:
        rng = random.Random(self.seed + 1)
        while True:
            pair = (rng.randrange(self.limit), rng.randrange(self.limit))
            if pair not in self._held_out:
                yield self.problem(*pair)

    def eval_problems(self) -> list[Problem]:
        return [self.problem(a, b) for a, b in self._eval_pairs]
