"""The optimiser's configuration: AdamW, how each batch is used, the learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from asyncrlhf._checks import check_nonnegative_int, check_positive_int

__all__ = ["LrDecay", "OptimConfig"]

LrDecay = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and how each batch is used: ``ppo_epochs`` passes, ``mini_batches``
    optimiser steps per pass, the global gradient norm clipped at ``grad_clip`` (None:
    no clipping), and the learning-rate schedule: raised linearly over the first
    ``warmup_updates`` optimiser updates (0: none), then held (``decay="constant"``) or
    lowered to ``min_lr_ratio``·lr at update ``total_updates`` (``"linear"``, ``"cosine"``).
    ``micro_batch_size`` rows at a time go through forward and backward, the gradients
    accumulated into one update (None: the whole mini-batch at once); the update is the
    same (see ``TrainerWorker._accumulate``)."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    warmup_updates: int = 0
    decay: LrDecay = "constant"
    total_updates: int | None = None
    min_lr_ratio: float = 0.0
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")
        check_positive_int("ppo_epochs", self.ppo_epochs)
        check_positive_int("mini_batches", self.mini_batches)
        check_nonnegative_int("warmup_updates", self.warmup_updates)
        if self.micro_batch_size is not None:
            check_positive_int("micro_batch_size", self.micro_batch_size)
        if self.decay not in get_args(LrDecay):
            raise ValueError(f"decay must be 'constant', 'linear' or 'cosine', got {self.decay!r}")
        if self.decay != "constant" and (self.total_updates is None or self.total_updates <= self.warmup_updates):
            raise ValueError(
                f"decay={self.decay!r} needs total_updates > warmup_updates={self.warmup_updates}, "
                f"got {self.total_updates!r}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")

    def lr_at(self, update: int) -> float:
        """The learning rate of optimiser update ``update`` (0-based): the linear warm-up,
        lr·(update + 1)/warmup_updates, then ``lr`` or its decay (held at the floor after
        ``total_updates``)."""
        if update < self.warmup_updates:
            return self.lr * (update + 1) / self.warmup_updates
        if self.decay == "constant":
            return self.lr
        assert self.total_updates is not None
        progress = min(1.0, (update - self.warmup_updates) / (self.total_updates - self.warmup_updates))
        shape = 1.0 - progress if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape)
