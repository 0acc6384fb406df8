"""Decode-then-Python reward: for string logic that has no token-level form.

This is the path the tensor-native rewards exist to avoid (it copies every token to
the host, decodes, and runs Python per row). It is kept for users who need it and as
the baseline the reward benchmark measures against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from asyncrlhf.rewards._tokens import check_generated_ids

__all__ = ["make_text_reward", "text_reward"]

ScoreFn = Callable[[str, Any], float]


def text_reward(
    generated_ids: torch.Tensor,
    tokenizer: Any,
    score_fn: ScoreFn,
    references: Sequence[Any] | None = None,
    eos_token_id: int | None = None,
    skip_special_tokens: bool = True,
) -> torch.Tensor:
    """Score each decoded response with a Python function.

    Args:
        generated_ids: LongTensor[B, L], response tokens only.
        tokenizer: a Hugging Face tokenizer (anything with ``batch_decode``).
        score_fn: ``score_fn(text, reference) -> float`` applied per row.
        references: B references passed to ``score_fn`` (None for each row if absent).
        eos_token_id: rows are cut at their first EOS before decoding; defaults to
            ``tokenizer.eos_token_id``.
        skip_special_tokens: forwarded to ``batch_decode``.

    Returns:
        float32 Tensor[B] on ``generated_ids``' device.
    """
    ids = check_generated_ids(generated_ids)
    if references is not None and len(references) != ids.shape[0]:
        raise ValueError(f"references has {len(references)} items but generated_ids has {ids.shape[0]} rows")
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    rows = ids.tolist()  # the host round trip this path is known for
    if eos is not None:
        rows = [row[: row.index(eos)] if eos in row else row for row in rows]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens)
    refs = references if references is not None else [None] * len(texts)
    scores = [float(score_fn(text, ref)) for text, ref in zip(texts, refs, strict=True)]
    return torch.tensor(scores, dtype=torch.float32, device=ids.device)


def make_text_reward(tokenizer: Any, score_fn: ScoreFn) -> Callable[..., torch.Tensor]:
    """Adapt a string scorer to the reward-function signature ``(ids, answers, eos)``.

    ``answers`` reach ``score_fn`` as references: strings, or token tensors that are
    decoded first.
    """

    def reward(generated_ids: torch.Tensor, answers: Sequence[Any], eos_token_id: int) -> torch.Tensor:
        references = [
            tokenizer.decode(a.tolist(), skip_special_tokens=True) if isinstance(a, torch.Tensor) else a
            for a in answers
        ]
        return text_reward(generated_ids, tokenizer, score_fn, references, eos_token_id)

    return reward
