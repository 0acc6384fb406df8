"""The supervised warm start that brings the tiny model to a partly-correct policy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["WarmStartConfig", "fit_answers", "warm_start"]


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on the addition task (prompt → answer + EOS)."""

    digits: int = 2
    steps: int = 550
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0


def warm_start(model: Any, tokenizer: Any, config: WarmStartConfig = WarmStartConfig()) -> list[float]:
    """Teach ``model`` the answer format and some arithmetic; returns the loss curve.

    Cross-entropy on the answer tokens and the EOS only (the prompt is given).
    """
    from asyncrlhf.tasks.addition import AdditionTask

    task = AdditionTask(tokenizer, digits=config.digits, seed=config.seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return fit_answers(model, task.train_problems(), eos, pad, config.steps, config.batch_size, config.lr)


def fit_answers(
    model: Any, problems: Iterator[Any], eos: int, pad: int, steps: int, batch_size: int, lr: float
) -> list[float]:
    """Supervised fine-tuning on ``problems`` (prompt → answer + EOS): cross-entropy on the
    answer and the EOS only, AdamW with a cosine schedule; the loss curve."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    losses = []
    model.train()
    for _ in range(steps):
        batch = [next(problems) for _ in range(batch_size)]
        rows = [torch.cat([p.prompt_ids, p.answer_ids, torch.tensor([eos])]) for p in batch]
        ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)  # (B, T)
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for i, (p, row) in enumerate(zip(batch, rows, strict=True)):  # supervise answer + EOS only
            labels[i, p.prompt_ids.shape[0] : row.shape[0]] = row[p.prompt_ids.shape[0] :]
            attention[i, : row.shape[0]] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses
