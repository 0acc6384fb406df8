"""Cheap experiences for buffer tests (tensors shared: only identity matters)."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from asyncrlhf.types import Experience

_PROMPT = torch.tensor([1, 2, 3])
_RESPONSE = torch.tensor([4, 5])
_LOGPROBS = torch.tensor([-0.1, -0.2])


def make_exp(prompt_id: Hashable = 0, version: int = 0, reward: float = 0.0) -> Experience:
    return Experience(_PROMPT, _RESPONSE, _LOGPROBS, reward=reward, policy_version=version, prompt_id=prompt_id)
