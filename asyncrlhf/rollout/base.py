"""What every rollout engine does: sample completions with behaviour log-probs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from asyncrlhf._checks import check_integer, check_nonnegative_int, check_positive_int, check_rank, check_tensor

__all__ = ["EngineBase", "InFlight", "RolloutEngine", "Sample", "Sampling", "check_generate_args"]


@dataclass(frozen=True)
class Sampling:
    """How an engine samples: response cap, temperature (0: greedy), nucleus mass.

    The trainer recomputes log-probs at the same temperature, so behaviour and trainer
    log-probs describe the same distribution.
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_positive_int("max_new_tokens", self.max_new_tokens)
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")


@dataclass(slots=True)
class Sample:
    """One completion of one prompt.

    Attributes:
        prompt_index: index of the prompt in the ``generate`` call.
        prompt_ids: LongTensor[P].
        response_ids: LongTensor[R], EOS included when the engine emitted it.
        logprobs: Tensor[R], float32 log-probs of ``response_ids`` under the
            distribution actually sampled from.
        policy_version: version of the weights that generated it; with weights updated
            in flight, the oldest of its tokens' versions.
        token_versions: LongTensor[R], the version that sampled each token; None when
            every token is ``policy_version``'s.
    """

    prompt_index: int
    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    logprobs: torch.Tensor
    policy_version: int
    token_versions: torch.Tensor | None = None


@dataclass(frozen=True)
class InFlight:
    """Weight updates while a batch generates (an engine with ``updates_in_flight``).

    Before the logits of response position ``t`` ≥ 1 are computed, for every row at once,
    the engine calls ``before(t)``, which may load new weights into it
    (``load_weights``); the tokens from ``t`` on are then sampled by the new version and
    tagged with it. The KV cache of the positions before ``t`` was computed by the older
    weights: kept as it is (``recompute_kv=False``, as PipelineRL) or recomputed with
    the new weights (one forward over prompt and response so far).
    """

    before: Callable[[int], None]
    recompute_kv: bool = False


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates ``num_samples`` completions per prompt and knows its weights' version.

    ``generate`` returns samples prompt-major: all samples of prompt 0, then prompt 1…
    This is everything a runtime calls on an engine; :class:`EngineBase` gives the
    version bookkeeping, the sampling-stream methods and ``agenerate`` to subclasses.
    """

    @property
    def version(self) -> int: ...

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        """``inflight``: weight updates between decode steps (engines with ``updates_in_flight``)."""
        ...

    async def agenerate(self, prompts: Sequence[torch.Tensor], num_samples: int = 1) -> list[Sample]: ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

    def checksum(self) -> str:
        """SHA-256 of the weights the engine holds (``models.weights_checksum``), so a
        sync can be verified against the trainer's snapshot."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream from ``seed`` (a Ray chunk's own seed)."""
        ...

    def rng_state(self) -> torch.Tensor | None:
        """The sampling stream's state, for checkpoints (None: not seedable)."""
        ...

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Put :meth:`rng_state`'s state back."""
        ...


class EngineBase:
    """What every engine shares: version bookkeeping and the async variant.

    A mixin, not a contract: :class:`RolloutEngine` is the contract.
    """

    _version: int = 0
    updates_in_flight: bool = False  # whether generate takes ``inflight`` (can load weights mid-batch)

    @property
    def version(self) -> int:
        return self._version

    def _set_version(self, version: int) -> None:
        self._version = check_nonnegative_int("version", version)

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        raise NotImplementedError

    def extend(
        self, rows: Sequence[tuple[torch.Tensor, torch.Tensor]], budget: int, inflight: InFlight | None = None
    ) -> list[Sample]:
        """Continue each ``(prompt_ids, response so far)`` row by up to ``budget`` tokens:
        one sample per row, holding its new tokens only (a continuous rollout's step).

        This default reads prompt and response so far as one prompt, so the KV cache is
        recomputed with the weights the engine holds now; an engine keeping its cache
        across calls would override it."""
        check_positive_int("budget", budget)
        cap = self.max_new_tokens  # type: ignore[attr-defined]
        self.max_new_tokens = min(budget, cap)
        try:
            joined = [torch.cat([prompt, response.to(prompt.device)]) for prompt, response in rows]
            return self.generate(joined, 1, inflight) if inflight is not None else self.generate(joined, 1)
        finally:
            self.max_new_tokens = cap

    def _check_inflight(self, inflight: InFlight | None) -> None:
        if inflight is not None and not self.updates_in_flight:
            raise ValueError(f"{type(self).__name__} cannot update its weights in flight (inflight must be None)")

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream from ``seed`` (so a batch's samples do not depend
        on which worker drew it). Engines without a seedable stream keep theirs."""

    def rng_state(self) -> torch.Tensor | None:
        """The sampling stream's state (for checkpoints); None: not seedable here."""
        generator = getattr(self, "_generator", None)
        return None if generator is None else generator.get_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        generator = getattr(self, "_generator", None)
        if generator is not None and state is not None:
            generator.set_state(state.cpu())

    async def agenerate(self, prompts: Sequence[torch.Tensor], num_samples: int = 1) -> list[Sample]:
        """``generate`` on a worker thread, so an event loop keeps serving meanwhile."""
        return await asyncio.to_thread(self.generate, prompts, num_samples)


def check_generate_args(prompts: Sequence[torch.Tensor], num_samples: int) -> None:
    """Validate ``generate``'s arguments, naming the bad one."""
    check_positive_int("num_samples", num_samples)
    if len(prompts) == 0:
        raise ValueError("prompts must not be empty")
    for i, prompt in enumerate(prompts):
        check_tensor(f"prompts[{i}]", prompt)
        check_rank(f"prompts[{i}]", prompt, 1)
        check_integer(f"prompts[{i}]", prompt)
        if prompt.shape[0] == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token (e.g. BOS)")
