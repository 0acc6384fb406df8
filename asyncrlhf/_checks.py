"""Argument checks shared by the public functions.

Every check names the argument and the offending value, so a bad call fails at the
boundary with a message a user can act on instead of deep inside a kernel. Checks only
look at shapes and dtypes (metadata): they never read tensor data, so they cost no
device synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "check_float",
    "check_integer",
    "check_nonnegative_int",
    "check_positive_int",
    "check_rank",
    "check_same_shape",
    "check_tensor",
]


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_rank(name: str, value: torch.Tensor, ranks: int | Sequence[int]) -> None:
    allowed = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if value.dim() not in allowed:
        wanted = " or ".join(str(r) for r in allowed)
        raise ValueError(f"{name} must have rank {wanted}, got shape {tuple(value.shape)}")


def check_integer(name: str, value: torch.Tensor) -> None:
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {value.dtype}")


def check_float(name: str, value: torch.Tensor) -> None:
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")


def check_same_shape(name: str, value: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if value.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)} but {ref_name} has shape {tuple(ref.shape)}")


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_nonnegative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value
