"""The policy-loss registry: one decorator, one signature, options checked at bind time.

A loss is a function ``fn(logprobs, old_logprobs, advantages, mask=None, *, <options>)
-> (loss, metrics)``, registered under a name with :func:`register_policy_loss` (as
verl's ``@register_policy_loss``). A loss that takes ``ref_logprobs`` receives the
reference policy's log-probs; one that takes ``prox_logprobs`` receives the proximal
policy's (the trainer's weights at the start of the step, recomputed once per step).
:func:`policy_loss` binds options once, checked against the function's own signature,
so a typo fails when the trainer is built, not mid-run; the bound loss keeps the
function itself (``.fn``), so a reader goes straight to it.

A loss registered ``row_separable`` promises that each row's per-token loss depends on
that row alone and is exactly 0, gradient included, where its advantage is 0 (unless an
option such as ``kl_coef`` adds a term of its own): the trainer may then leave such rows
out of the forward and backward pass and rescale (see :attr:`BoundLoss.skips_zero_advantage`).
A loss whose terms couple rows (M2PO's batch-wide mask) must not claim it.

Adding an objective is one file: the decorated function (plus, for specs, its model in
``pipelines.algorithms``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BoundLoss", "PolicyLoss", "get_policy_loss", "policy_loss", "policy_losses", "register_policy_loss"]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
# Passed by the trainer, not options; a loss that names ref_logprobs or prox_logprobs gets them.
_DATA = ("logprobs", "old_logprobs", "advantages", "mask", "ref_logprobs", "prox_logprobs")
_REGISTRY: dict[str, PolicyLoss] = {}
_ROW_SEPARABLE: set[str] = set()
# Options that add a term to rows whose advantage is 0 (GRPO's KL to the reference).
_ROW_TERMS = ("kl_coef",)


def register_policy_loss(name: str, row_separable: bool = False) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register ``fn`` as the policy loss ``name``; returns ``fn`` unchanged.
    ``row_separable``: see the module docstring."""

    def decorate(fn: PolicyLoss) -> PolicyLoss:
        params = list(inspect.signature(fn).parameters)
        if params[:4] != list(_DATA[:4]):
            raise TypeError(f"policy loss {name!r} must start with {_DATA[:4]}, got {params[:4]}")
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        _REGISTRY[name] = fn
        if row_separable:
            _ROW_SEPARABLE.add(name)
        return fn

    return decorate


def policy_losses() -> tuple[str, ...]:
    """The registered names."""
    return tuple(sorted(_REGISTRY))


def get_policy_loss(name: str) -> PolicyLoss:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm (policy loss) {name!r}: registered are {policy_losses()}") from None


@dataclass(frozen=True)
class BoundLoss:
    """A registered loss with its options bound: ``loss(logprobs, old, advantages, mask, ref_logprobs)``."""

    name: str
    fn: PolicyLoss
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_reference(self) -> bool:
        return "ref_logprobs" in inspect.signature(self.fn).parameters

    @property
    def uses_proximal(self) -> bool:
        return "prox_logprobs" in inspect.signature(self.fn).parameters

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether rows with a zero advantage may be left out of the pass: the loss is
        row-separable and no bound option gives those rows a term of their own."""
        return self.name in _ROW_SEPARABLE and not any(self.options.get(key) for key in _ROW_TERMS)

    @property
    def loss_agg(self) -> str:
        """The aggregation the bound loss reduces with (its ``loss_agg`` default unless bound)."""
        default = inspect.signature(self.fn).parameters.get("loss_agg")
        return str(self.options.get("loss_agg", default.default if default is not None else "token-mean"))

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        prox_logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        extra = {"ref_logprobs": ref_logprobs} if self.uses_reference else {}
        if self.uses_proximal:
            extra["prox_logprobs"] = prox_logprobs
        return self.fn(logprobs, old_logprobs, advantages, mask, **extra, **self.options)


def policy_loss(name: str, **options: Any) -> BoundLoss:
    """The loss ``name`` with ``options`` bound; unknown options fail here, naming them."""
    fn = get_policy_loss(name)
    data = [key for key in options if key in _DATA]
    if data:
        raise ValueError(f"{data} are inputs of the loss, not options")
    try:
        inspect.signature(fn).bind_partial(**options)
    except TypeError:
        allowed = [p for p in inspect.signature(fn).parameters if p not in _DATA]
        unknown = sorted(set(options) - set(allowed))
        raise ValueError(f"unknown options {unknown} for policy loss {name!r}: allowed {allowed}") from None
    return BoundLoss(name, fn, dict(options))
