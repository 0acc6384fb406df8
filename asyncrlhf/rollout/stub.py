"""A model-free engine for unit tests, and a latency model of a remote rollout device."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import torch

from asyncrlhf._checks import check_positive_int
from asyncrlhf.models import weights_checksum
from asyncrlhf.rollout.base import EngineBase, InFlight, Sample, check_generate_args

__all__ = ["LatencyModelEngine", "LongTailLatencyEngine", "StubEngine"]


class StubEngine(EngineBase):
    """Uniformly random tokens from a seeded generator; log-probs log(1/V). Tests only.

    Real shapes and real version bookkeeping, no model: for exercising buffers,
    workers and orchestration without the cost of a forward pass.
    """

    def __init__(
        self, vocab_size: int = 32, max_new_tokens: int = 8, eos_token_id: int = 2, seed: int = 0, version: int = 0
    ) -> None:
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
        self.eos_token_id = eos_token_id
        self._generator = torch.Generator().manual_seed(seed)
        self._set_version(version)
        self._weights: Mapping[str, torch.Tensor] | None = None

    updates_in_flight = True

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        check_generate_args(prompts, num_samples)
        n = len(prompts) * num_samples
        # One draw for the whole batch: a stub must cost (almost) nothing.
        lengths = torch.randint(1, self.max_new_tokens + 1, (n,), generator=self._generator).tolist()
        tokens = torch.randint(0, self.vocab_size, (n, self.max_new_tokens), generator=self._generator)
        logprobs = torch.full((self.max_new_tokens,), -math.log(self.vocab_size))
        versions = self._decode(inflight)
        by_position = torch.tensor(versions) if versions[0] != versions[-1] else None
        return [
            Sample(
                i // num_samples,
                prompts[i // num_samples],
                tokens[i, :length],
                logprobs[:length],
                versions[0] if by_position is None else int(by_position[:length].min()),
                None if by_position is None else by_position[:length].clone(),
            )
            for i, length in enumerate(lengths)
        ]

    def _decode(self, inflight: InFlight | None) -> list[int]:
        """Walk the decode steps (a stub's cost nothing), calling ``inflight`` between
        them; the version of every position."""
        versions = [self._version]
        if inflight is not None:
            self._check_inflight(inflight)
            for t in range(1, self.max_new_tokens):
                inflight.before(t)
                versions.append(self._version)
        return versions

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self._weights = state_dict  # held, not used: there is no model
        self._set_version(version)

    def checksum(self) -> str:
        """Checksum of the weights last loaded."""
        if self._weights is None:
            raise RuntimeError("no weights loaded yet")
        return weights_checksum(self._weights)


class LatencyModelEngine(StubEngine):
    """A LATENCY MODEL of a rollout device of its own (e.g. a remote inference GPU).

    Produces stub samples at no compute cost and holds each call for
    ``seconds_per_token`` × ``max_new_tokens`` of wall time, sleeping, so it uses
    almost no CPU of ours. It measures how well orchestration overlaps generation with
    training when the two run on separate devices. Never a default: benchmarks only.
    """

    def __init__(self, seconds_per_token: float, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if seconds_per_token < 0:
            raise ValueError(f"seconds_per_token must be >= 0, got {seconds_per_token!r}")
        self.seconds_per_token = seconds_per_token

    def _decode(self, inflight: InFlight | None) -> list[int]:
        # A batch holds the device until its longest row could have finished: one
        # token's time per position, weights loaded in flight between them.
        versions = [self._version]
        for t in range(self.max_new_tokens):
            if t and inflight is not None:
                inflight.before(t)
                versions.append(self._version)
            time.sleep(self.seconds_per_token)
        return versions


class LongTailLatencyEngine(LatencyModelEngine):
    """A LATENCY MODEL with a long tail of response lengths (benchmarks only).

    A response's first token decides its class: one in ``1 / long_share`` responses is
    long. Each later token ends the response (EOS) with probability ln 2 / median, or
    ln 2 / (``long_factor`` × median) in a long one: geometric lengths, so the long
    responses' median is ``long_factor`` times the others'. A call holds for one token's
    time per decode step while any of its rows is still going, loading weights between
    steps when given ``inflight``. Memoryless, so :meth:`extend` continues a row from its
    first token alone.
    """

    def __init__(
        self, seconds_per_token: float, median: float, long_share: float = 0.05, long_factor: float = 10.0, **kwargs
    ) -> None:
        super().__init__(seconds_per_token, **kwargs)
        if not (median >= 1 and 0 < long_share < 1 and long_factor >= 1):
            raise ValueError(
                f"need median >= 1, 0 < long_share < 1 and long_factor >= 1; got median={median!r}, "
                f"long_share={long_share!r}, long_factor={long_factor!r}"
            )
        self.hazard = (math.log(2) / median, math.log(2) / (median * long_factor))
        self.long_share = long_share

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        check_generate_args(prompts, num_samples)
        rows = [(p, torch.zeros(0, dtype=torch.long)) for p in prompts for _ in range(num_samples)]
        samples = self.extend(rows, self.max_new_tokens, inflight)
        for i, sample in enumerate(samples):
            sample.prompt_index = i // num_samples
        return samples

    def extend(
        self, rows: Sequence[tuple[torch.Tensor, torch.Tensor]], budget: int, inflight: InFlight | None = None
    ) -> list[Sample]:
        self._check_inflight(inflight)
        budget = min(check_positive_int("budget", budget), self.max_new_tokens)
        g = self._generator
        first = [r[0] if r.numel() else None for _, r in rows]
        draws = torch.rand(len(rows), budget + 1, generator=g)  # class, then one EOS draw per step
        tokens = torch.randint(4, self.vocab_size - 1, (len(rows), budget), generator=g)  # never EOS (2)
        out: list[list[int]] = [[] for _ in rows]
        live = [True] * len(rows)
        versions: list[int] = []
        for t in range(budget):
            if not any(live):
                break
            if t and inflight is not None:
                inflight.before(t)
            versions.append(self._version)
            time.sleep(self.seconds_per_token)
            for i in range(len(rows)):
                if not live[i]:
                    continue
                long = (draws[i, 0] < self.long_share) if first[i] is None else int(first[i]) % 2 == 1
                token = int(tokens[i, t])
                if first[i] is None:  # the first token carries the class: odd ids are long
                    token = (token // 2) * 2 + int(bool(long))
                    first[i] = torch.tensor(token)
                elif bool(draws[i, t + 1] < self.hazard[int(bool(long))]):
                    token, live[i] = self.eos_token_id, False
                out[i].append(token)
        return [self._sample(i, prompt, out[i], versions) for i, (prompt, _) in enumerate(rows)]

    def _sample(self, i: int, prompt: torch.Tensor, tokens: list[int], versions: list[int]) -> Sample:
        n = len(tokens)
        mine = torch.tensor(versions[:n])
        mixed = n > 0 and versions[0] != versions[n - 1]
        logprobs = torch.full((n,), -math.log(self.vocab_size))
        return Sample(i, prompt, torch.tensor(tokens, dtype=torch.long), logprobs, versions[0], mine if mixed else None)
