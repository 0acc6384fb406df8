"""Policies: the tiny default model and its tokenizer (:mod:`.tiny`), its warm start
(:mod:`.warmstart`), the shipped start checkpoint, caching and loading (:mod:`.policies`),
and the numerics rollout and training share (:mod:`.ops`)."""

from asyncrlhf.models.ops import (
    PIECE_BYTES,
    Checksum,
    at_least_float32,
    cache_argument,
    drop_weights,
    gather_cache_rows,
    publish_pieces,
    state_buckets,
    token_logprobs,
    weightless_copy,
    weights_checksum,
)
from asyncrlhf.models.policies import (
    SHIPPED_POLICY,
    build_policy,
    cache_dir,
    load_pretrained,
    load_tokenizer,
    pretrained_policy,
    shipped_policy,
)
from asyncrlhf.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from asyncrlhf.models.warmstart import WarmStartConfig, fit_answers, warm_start

__all__ = [
    "PIECE_BYTES",
    "SHIPPED_POLICY",
    "Checksum",
    "TinyModelConfig",
    "WarmStartConfig",
    "at_least_float32",
    "build_char_tokenizer",
    "build_policy",
    "build_tiny_model",
    "cache_argument",
    "cache_dir",
    "drop_weights",
    "fit_answers",
    "gather_cache_rows",
    "load_pretrained",
    "load_tokenizer",
    "pretrained_policy",
    "publish_pieces",
    "shipped_policy",
    "state_buckets",
    "token_logprobs",
    "warm_start",
    "weightless_copy",
    "weights_checksum",
]
