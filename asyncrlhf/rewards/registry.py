"""Named reward terms and their weighted composition.

A spec names reward terms by ``kind`` with a weight. A kind is either a registered
name (the built-in tensor-native rewards, or anything added with
:func:`register_reward`) or a dotted import path to a user function
(``"my_pkg.rewards:score"`` or ``"my_pkg.rewards.score"``). Every reward function
has the signature ``fn(generated_ids, answers, eos_token_id) -> Tensor[B]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from asyncrlhf.rewards._tokens import as_padded_patterns, check_generated_ids, first_true_index
from asyncrlhf.rewards.contains import tensor_native_reward
from asyncrlhf.rewards.exact import exact_match_reward
from asyncrlhf.rewards.simple import gpu_reward_simple

__all__ = [
    "CompositeReward",
    "RewardFn",
    "RewardTerm",
    "available_rewards",
    "get_reward",
    "register_reward",
    "split_reward",
]

RewardFn = Callable[[torch.Tensor, Any, int], torch.Tensor]

_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering ``fn`` as reward kind ``name``."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward kind {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorator


def available_rewards() -> list[str]:
    """The registered reward kinds, sorted."""
    return sorted(_REGISTRY)


def get_reward(kind: str) -> RewardFn:
    """Resolve a registered kind or a dotted import path to a reward function."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    module_name, sep, attr = kind.partition(":")
    if not sep:
        module_name, _, attr = kind.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"unknown reward kind {kind!r}: expected one of {available_rewards()} "
            "or a dotted path 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward kind {kind!r} could not be imported: {err}") from err
    except Exception as err:  # the module itself is broken: a syntax error, or it raised at import
        where = f" ({err.filename}, line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise ValueError(
            f"reward kind {kind!r}: importing {module_name!r} failed: {type(err).__name__}: "
            f"{err.msg if isinstance(err, SyntaxError) else err}{where}"
        ) from err
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward kind {kind!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward kind {kind!r} resolves to a non-callable {type(fn).__name__}")
    return fn


register_reward("contains")(tensor_native_reward)
register_reward("exact_match")(exact_match_reward)


@register_reward("target_token")
def _target_token(generated_ids: torch.Tensor, answers: Any, eos_token_id: int) -> torch.Tensor:
    """1.0 where the answer's first token appears before EOS (gpu_reward_simple)."""
    ids = check_generated_ids(generated_ids)
    padded, _ = as_padded_patterns(answers, ids.shape[0], ids.device, name="answers")
    if padded.shape[1] == 0:
        return torch.zeros(ids.shape[0], dtype=torch.float32, device=ids.device)
    return gpu_reward_simple(ids, padded[:, 0], eos_token_id)


@register_reward("terminated")
def _terminated(generated_ids: torch.Tensor, answers: Any, eos_token_id: int) -> torch.Tensor:
    """1.0 where the response emits EOS at all (a format term)."""
    ids = check_generated_ids(generated_ids)
    return (first_true_index(ids == eos_token_id) < ids.shape[1]).float()


def split_reward(out: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A reward function's output as ``(scores, flags)``: a plain Tensor[B] has no
    flags; a decoded reward also returns per-row counts (``{"timeouts": Tensor[B], ...}``)."""
    if isinstance(out, tuple):
        scores, flags = out
        return scores, dict(flags)
    return out, {}


@dataclass(frozen=True, slots=True)
class RewardTerm:
    """One weighted term of a composite reward: ``kind`` resolved by :func:`get_reward`,
    or ``fn`` given (a reward built with state, e.g. a
    :class:`~asyncrlhf.rewards.decoded.DecodedReward` holding a tokenizer)."""

    kind: str
    weight: float = 1.0
    fn: RewardFn | None = None


class CompositeReward:
    """Weighted sum of reward terms, evaluated on the tokens' device.

    Example:
        >>> reward = CompositeReward([RewardTerm("exact_match", 1.0), RewardTerm("terminated", 0.1)])
        >>> ids = torch.tensor([[4, 2], [5, 2]])
        >>> reward(ids, [torch.tensor([4])] * 2, eos_token_id=2).tolist()
        [1.100000023841858, 0.10000000149011612]
    """

    def __init__(self, terms: Sequence[RewardTerm]) -> None:
        if len(terms) == 0:
            raise ValueError("terms must name at least one reward term")
        self.terms = list(terms)
        self._fns = [term.fn if term.fn is not None else get_reward(term.kind) for term in self.terms]

    def components(self, generated_ids: torch.Tensor, answers: Any, eos_token_id: int) -> dict[str, torch.Tensor]:
        """Each term's unweighted reward, keyed by kind."""
        return self._parts(generated_ids, answers, eos_token_id)[0]

    def _parts(self, ids: torch.Tensor, answers: Any, eos: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        parts: dict[str, torch.Tensor] = {}
        flags: dict[str, Any] = {}
        for term, fn in zip(self.terms, self._fns, strict=True):
            scores, term_flags = split_reward(fn(ids, answers, eos))
            parts[term.kind] = scores.float()
            for key, rows in term_flags.items():
                flags[key] = flags[key] + rows if key in flags else rows
        return parts, flags

    def __call__(self, generated_ids: torch.Tensor, answers: Any, eos_token_id: int) -> Any:
        """The weighted sum, Tensor[B]; ``(sum, flags)`` when a term reports per-row
        flags (a decoded reward's timeouts and errors, summed over terms)."""
        parts, flags = self._parts(generated_ids, answers, eos_token_id)
        total = torch.zeros(generated_ids.shape[0], dtype=torch.float32, device=generated_ids.device)
        for term in self.terms:
            total += term.weight * parts[term.kind]
        return (total, flags) if flags else total

    def close(self) -> None:
        """Release what the terms hold (a decoded reward's process pool)."""
        for fn in self._fns:
            close = getattr(fn, "close", None)
            if callable(close):
                close()
