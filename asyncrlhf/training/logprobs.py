"""Log-probs of a batch's response tokens under a model, each distinct prompt read once."""

from __future__ import annotations

from typing import Any

import torch

from asyncrlhf.models import cache_argument, gather_cache_rows, token_logprobs
from asyncrlhf.types import ExperienceBatch

__all__ = ["prompt_groups", "sequence_logprobs"]


def sequence_logprobs(
    model: Any, batch: ExperienceBatch, temperature: float = 1.0, share_prompts: bool = True, always: bool = False
) -> torch.Tensor:
    """Log-probs of the response tokens under ``model`` at ``temperature``: Tensor[B, R].

    Each distinct prompt is read once (a GRPO batch holds each prompt G times): its KV
    cache, gradient and all, is gathered for its rows, which then read only their
    responses. The gradient reaching the prompt is the sum over its rows, as in a pass
    over every row; only float rounding differs. Where the prompts are all distinct, the
    model's cache cannot be gathered, or ``share_prompts`` is False, one pass reads prompt
    and response of every row and materialises only the logits that predict response
    tokens (``logits_to_keep``). ``always``: share even where the prompts are all distinct,
    so the number of forward passes depends on the response width alone (the ranks of a
    trainer group must all make the same passes).
    """
    width = batch.response_ids.shape[1]
    if share_prompts:
        n, inverse = prompt_groups(batch)
        if always or n < len(batch):
            logits = _shared_prompt_logits(model, batch, inverse, n)
            if logits is not None:
                return token_logprobs(logits, batch.response_ids, temperature)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=width + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, R, V): the last kept column predicts past the end
    return token_logprobs(logits, batch.response_ids, temperature)


def prompt_groups(batch: ExperienceBatch) -> tuple[int, torch.Tensor]:
    """``(n, inverse)``: the batch's ``n`` distinct prompts, and each row's prompt index."""
    prompts, inverse = torch.unique(batch.input_ids[:, : batch.prompt_width], dim=0, return_inverse=True)
    return prompts.shape[0], inverse


def _shared_prompt_logits(model: Any, batch: ExperienceBatch, inverse: torch.Tensor, n: int) -> torch.Tensor | None:
    """The (B, R, V) logits predicting each response token, each of the ``n`` distinct
    prompts read once (``inverse``: row → prompt); None when the cache has no gather."""
    width, p = batch.response_ids.shape[1], batch.prompt_width
    rows = torch.arange(len(batch), device=inverse.device)
    first = torch.full((n,), len(batch), device=inverse.device).scatter_reduce(0, inverse, rows, "amin")
    arg = cache_argument(model)
    out = model(
        input_ids=batch.input_ids[first, :p],
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        logits_to_keep=1,
        use_cache=True,
    )
    # (B, V): the prompt's last position predicts response token 0. index_select, not
    # [inverse]: its backward adds in order (see gather_cache_rows).
    last = out.logits[:, -1, :].index_select(0, inverse)
    if width == 1:
        return last[:, None, :]
    cache = getattr(out, arg)
    if not gather_cache_rows(cache, inverse):  # (n, …) → (B, …), differentiable
        return None
    out = model(
        input_ids=batch.response_ids[:, :-1],
        attention_mask=batch.attention_mask[:, : p + width - 1],
        position_ids=batch.position_ids[:, p : p + width - 1],
        use_cache=True,
        **{arg: cache},
    )
    return torch.cat([last[:, None, :], out.logits], dim=1)  # (B, R, V)
