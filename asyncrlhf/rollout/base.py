"""What every rollout engine does: sample completions with behaviour log-probs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from asyncrlhf._checks import check_integer, check_rank, check_tensor

__all__ = ["RolloutEngine", "Sample", "check_prompts"]


@dataclass(slots=True)
class Sample:
    """One completion of one prompt.

    Attributes:
        prompt_index: index of the prompt in the ``generate`` call.
        prompt_ids: LongTensor[P].
        response_ids: LongTensor[R], EOS included when the engine emitted it.
        logprobs: Tensor[R], float32 log-probs of ``response_ids`` under the
            distribution actually sampled from.
        policy_version: version of the weights that generated it.
    """

    prompt_index: int
    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    logprobs: torch.Tensor
    policy_version: int


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates ``num_samples`` completions per prompt and knows its weights' version.

    ``generate`` returns samples prompt-major: all samples of prompt 0, then prompt 1…
    """

    @property
    def version(self) -> int: ...

    def generate(self, prompts: Sequence[torch.Tensor], num_samples: int = 1) -> list[Sample]: ...

    async def agenerate(self, prompts: Sequence[torch.Tensor], num_samples: int = 1) -> list[Sample]: ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...


def check_prompts(prompts: Sequence[torch.Tensor]) -> None:
    if len(prompts) == 0:
        raise ValueError("prompts must not be empty")
    for i, prompt in enumerate(prompts):
        check_tensor(f"prompts[{i}]", prompt)
        check_rank(f"prompts[{i}]", prompt, 1)
        check_integer(f"prompts[{i}]", prompt)
        if prompt.shape[0] == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token (e.g. BOS)")
