"""The tiny default model: a character tokenizer built with ``tokenizers`` and a small
Llama-style ``transformers`` model built from a config (no model hub needed)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["VOCABULARY", "TinyModelConfig", "build_char_tokenizer", "build_tiny_model"]

_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
_CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
VOCABULARY = _SPECIALS + _CHARS  # the character tokenizer's, in id order


def build_char_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast`` over printable ASCII.

    Ids: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then one id per character.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIALS + _CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the default Llama-style policy (≈ 0.34M parameters as given)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    max_position_embeddings: int = 64


def build_tiny_model(tokenizer: Any, config: TinyModelConfig = TinyModelConfig(), seed: int = 0) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` sized for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(llama)
