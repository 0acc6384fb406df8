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

Adding an objective is one file: the decorated function and its options, a dataclass
of :func:`~asyncrlhf.losses.options.option` fields deriving from
:class:`~asyncrlhf.losses.options.LossOptions`, passed as
``register_policy_loss(name, options=...)``. The options say what an experiment spec may
set (``pipelines`` turns them into the spec's ``algorithm`` section, with their bounds
and descriptions), and ``Options.loss_options`` maps them to the function's
keyword arguments. Their defaults must be the function's own (checked at registration),
so a default has one value wherever it is read.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncrlhf.losses.options import Options

__all__ = [
    "BoundLoss",
    "PolicyLoss",
    "get_policy_loss",
    "loss_options_of",
    "policy_loss",
    "policy_losses",
    "register_policy_loss",
]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
# Passed by the trainer, not options; a loss that names ref_logprobs or prox_logprobs gets them.
_DATA = ("logprobs", "old_logprobs", "advantages", "mask", "ref_logprobs", "prox_logprobs")
_REGISTRY: dict[str, PolicyLoss] = {}
_OPTIONS: dict[str, type[Options]] = {}
_ROW_SEPARABLE: set[str] = set()
# Options that add a term to rows whose advantage is 0 (GRPO's KL to the reference).
_ROW_TERMS = ("kl_coef",)


def register_policy_loss(
    name: str, row_separable: bool = False, options: type[Options] = Options
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register ``fn`` as the policy loss ``name`` with its ``options`` (an
    :class:`~asyncrlhf.losses.options.Options` dataclass; none by default); returns
    ``fn`` unchanged. ``row_separable``: see the module docstring."""

    def decorate(fn: PolicyLoss) -> PolicyLoss:
        params = list(inspect.signature(fn).parameters)
        if params[:4] != list(_DATA[:4]):
            raise TypeError(f"policy loss {name!r} must start with {_DATA[:4]}, got {params[:4]}")
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        _check_defaults(name, fn, options)
        _REGISTRY[name], _OPTIONS[name] = fn, options
        if row_separable:
            _ROW_SEPARABLE.add(name)
        return fn

    return decorate


def _check_defaults(name: str, fn: PolicyLoss, options: type[Options]) -> None:
    """The options' defaults, mapped to keyword arguments, are the function's own (the
    shared ``loss_agg`` aside: every objective defaults to token-mean in a spec)."""
    if not (isinstance(options, type) and issubclass(options, Options) and dataclasses.is_dataclass(options)):
        raise TypeError(f"policy loss {name!r}: options must be an Options dataclass, got {options!r}")
    signature = inspect.signature(fn).parameters
    for key, value in options().loss_options().items():
        if key not in signature:
            raise TypeError(f"policy loss {name!r}: option {key!r} is not an argument of {fn.__qualname__}")
        default = signature[key].default
        if key != "loss_agg" and default is not inspect.Parameter.empty and default != value:
            raise TypeError(f"policy loss {name!r}: option {key!r} defaults to {value!r}, the function to {default!r}")


def loss_options_of(name: str) -> type[Options]:
    """The options dataclass of the registered loss ``name``."""
    get_policy_loss(name)
    return _OPTIONS[name]


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
