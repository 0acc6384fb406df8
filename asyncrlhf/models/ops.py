"""Shared numerics: :func:`token_logprobs` is the one definition of "log-prob of a token
under temperature T" that the rollout engine and the trainer both use (so on-policy
ratios are exactly 1); KV-cache row gathering; weight checksums; a model's structure
without its weights, to fill with weights held elsewhere."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "PIECE_BYTES",
    "Checksum",
    "at_least_float32",
    "cache_argument",
    "drop_weights",
    "gather_cache_rows",
    "publish_pieces",
    "state_buckets",
    "token_logprobs",
    "weightless_copy",
    "weights_checksum",
]


def cache_argument(model: Any) -> str:
    """The name of ``model.forward``'s KV-cache argument (and output): transformers 5
    renamed ``past_key_values`` to ``cache``. Looked up once per model class (the
    trainer asks on every pass)."""
    return _cache_argument_of(type(model))


@functools.cache
def _cache_argument_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def gather_cache_rows(cache: Any, index: torch.Tensor) -> bool:
    """Replace a KV cache's batch rows by ``cache[index]``, differentiably; False when
    the cache cannot gather (it is then unchanged).

    transformers' own ``batch_select_indices`` gathers with advanced indexing, whose
    backward (``index_put_`` with accumulate) adds into repeated rows with atomic float
    adds across threads on the CPU: the sum's order, and so the gradient's last bits,
    then depend on thread timing. A dynamic layer's keys and values are gathered here
    with ``index_select`` instead, whose backward adds in index order (bit-reproducible
    at any thread count); any other layer keeps its own method.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        if not hasattr(cache, "batch_select_indices"):
            return False
        cache.batch_select_indices(index)
        return True
    for layer in layers:
        if _plain_dynamic_layer(layer):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        else:
            layer.batch_select_indices(index)
    return True


def _plain_dynamic_layer(layer: Any) -> bool:
    """A layer whose whole batch state is its ``keys`` and ``values`` (transformers'
    ``DynamicLayer`` itself, not a subclass that selects more)."""
    from transformers.cache_utils import DynamicLayer

    return (
        type(layer).batch_select_indices is DynamicLayer.batch_select_indices
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and isinstance(getattr(layer, "values", None), torch.Tensor)
        and layer.keys.numel() > 0
    )


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or in its own precision where that is higher (a float64 model's)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log π(token) under ``softmax(logits / T)``, in float32 (float64 logits stay float64:
    a float64 model's trainer keeps its precision).

    Args:
        logits: Tensor[..., V].
        tokens: LongTensor[...] matching ``logits`` without its last dimension.
        temperature: T > 0; 0 (greedy) is scored as T = 1.

    Returns:
        Tensor[...] of log-probs.
    """
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(at_least_float32(logits) / scale, dim=-1)  # (..., V)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def weights_checksum(weights: Any) -> str:
    """SHA-256 over every tensor of a model or state dict, in key order (device-agnostic)."""
    state: Mapping[str, torch.Tensor] = weights.state_dict() if hasattr(weights, "state_dict") else weights
    checksum = Checksum()
    checksum.update({name: state[name] for name in sorted(state)})
    return checksum.hexdigest()


# A streamed publication's pieces: what a trainer group's rank 0 holds beside its shards
# while it publishes (`asyncrlhf bench --suite full --case sharded` measures it)
PIECE_BYTES = 8 << 20


def state_buckets(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """``items`` (name, tensor), taken lazily, in dicts of about ``bucket_bytes`` each: a
    dict is yielded once it reaches that size (so it is at most that plus one tensor)."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in items:
        bucket[name] = t
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


def publish_pieces(pieces: Iterable[dict[str, torch.Tensor]], put: Callable[[Any], Any]) -> tuple[str, list[Any]]:
    """Hand each of a streamed publication's ``pieces`` to ``put`` (``ray.put``), taking
    their checksum on the way: ``(checksum, what put returned, in order)``. A piece is let
    go before the next is made, so no more than one is held."""
    checksum, out = Checksum(), []
    for piece in pieces:
        checksum.update(piece)
        out.append(put(piece))
        del piece  # not held while the stream gathers the next
    return checksum.hexdigest(), out


class Checksum:
    """:func:`weights_checksum` taken piece by piece: the same digest when the pieces
    together hold every tensor once, in key order (as a streamed publication yields them)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._last = ""

    def update(self, piece: Mapping[str, torch.Tensor]) -> None:
        for name, t in piece.items():
            if self._last and name <= self._last:
                raise ValueError(f"checksum pieces out of key order: {name!r} after {self._last!r}")
            tensor = t.detach().to("cpu").contiguous()
            self._digest.update(name.encode())
            self._digest.update(str(tensor.dtype).encode())
            self._digest.update(tensor.view(torch.uint8).numpy() if tensor.numel() else b"")  # no copy
            self._last = name

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def weightless_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and saved buffers are on the meta device (no
    storage; none is copied: they are swapped in the deep copy's memo), frozen, in eval
    mode. Unsaved buffers (rotary frequencies) are copied, as no state dict brings them."""
    saved = model.state_dict(keep_vars=True)
    memo = {id(t): _meta(t) for t in saved.values()}
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


def _meta(t: torch.Tensor) -> torch.Tensor:
    empty = torch.empty_like(t, device="meta")
    return torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) else empty


def drop_weights(model: torch.nn.Module) -> None:
    """Put ``model``'s saved tensors back on the meta device, freeing what they held."""
    for name, t in model.state_dict(keep_vars=True).items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        slots = module._parameters if leaf in module._parameters else module._buffers
        if not t.is_meta:
            slots[leaf] = _meta(t)
