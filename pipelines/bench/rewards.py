"""Reward benchmark: tensor-native reward vs the per-row loop vs decode+match.

    asyncrlhf bench --suite quick --case reward    # B=256, L=1024, V=32k on the CPU
    asyncrlhf bench --suite cuda --case reward     # on the GPU

All methods run on the same data and must agree row for row. Ratios are taken within
the run, so they transfer across machines better than absolute times; their targets
are in :data:`pipelines.bench.cases.TARGETS`. Adversarial input: every response token equals
the pattern head.
"""

from __future__ import annotations

from dataclasses import asdict

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrlhf.rewards import tensor_native_reward, text_reward
from asyncrlhf.rewards._tokens import as_padded_patterns
from asyncrlhf.rewards.contains import _column_scan
from pipelines.bench._timing import measure_interleaved

PAD, UNK, EOS = 0, 1, 2


def make_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` ids (w3 … w{V-1}), built with `tokenizers`."""
    vocab = {"<pad>": PAD, "<unk>": UNK, "</s>": EOS, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def make_batch(batch: int, length: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Responses with realistic EOS positions and 1–16-token answer patterns.

    90% of rows end at a random position in [L/4, L) (EOS then padding), 10% never end.
    Half the rows contain their pattern before EOS, a quarter only after it (which must
    not count), the rest not at all.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    lengths = torch.randint(length // 4, length, (batch,), generator=g)
    ends = torch.rand(batch, generator=g) < 0.9
    patterns = []
    for b in range(batch):
        p = int(torch.randint(1, 17, (1,), generator=g))
        pattern = torch.randint(3, vocab, (p,), generator=g)
        end = int(lengths[b]) if ends[b] else length
        kind = float(torch.rand(1, generator=g))
        if kind < 0.5 and end >= p:
            start = int(torch.randint(0, end - p + 1, (1,), generator=g))
            ids[b, start : start + p] = pattern
        elif kind < 0.75 and ends[b] and length - end - 1 >= p:
            ids[b, end + 1 : end + 1 + p] = pattern
        if ends[b]:
            ids[b, end] = EOS
            ids[b, end + 1 :] = torch.where(torch.rand(length - end - 1, generator=g) < 0.5, PAD, ids[b, end + 1 :])
        patterns.append(pattern)
    return ids, patterns


def per_row_loop(generated_ids: torch.Tensor, patterns: list[torch.Tensor], eos_token_id: int) -> torch.Tensor:
    """The seed's algorithm: trim each row at its first EOS, ``unfold`` windows, compare."""
    batch, length = generated_ids.shape
    eos_mask = generated_ids == eos_token_id
    first_eos = torch.where(
        eos_mask.any(dim=1), eos_mask.int().argmax(dim=1), torch.full((batch,), length, device=generated_ids.device)
    )
    rewards = torch.zeros(batch, device=generated_ids.device)
    for i in range(batch):
        seq = generated_ids[i, : first_eos[i]]
        pattern = patterns[i]
        if pattern.shape[0] == 0 or pattern.shape[0] > seq.shape[0]:
            continue
        windows = seq.unfold(0, pattern.shape[0], 1)
        rewards[i] = 1.0 if (windows == pattern).all(dim=1).any() else 0.0
    return rewards


def run(
    batch: int = 256, length: int = 1024, vocab: int = 32_000, device: str = "cpu", repeats: int = 20
) -> dict[str, object]:
    """Time every method on one data set; returns figures and ratios."""
    dev = torch.device(device)
    ids, patterns = make_batch(batch, length, vocab)
    ids = ids.to(dev)
    patterns = [p.to(dev) for p in patterns]
    padded, _ = as_padded_patterns(patterns, batch, dev)
    tokenizer = make_tokenizer(vocab)
    references = [" ".join(f"w{t}" for t in p.tolist()) for p in patterns]  # answers as text

    def decode_and_match() -> torch.Tensor:
        return text_reward(ids, tokenizer, lambda text, ref: float(f" {ref} " in f" {text} "), references, EOS)

    methods = {
        "tensor_native (list patterns)": lambda: tensor_native_reward(ids, patterns, EOS),
        "tensor_native (padded tensor)": lambda: tensor_native_reward(ids, padded, EOS),
        "per-row unfold loop (seed)": lambda: per_row_loop(ids, patterns, EOS),
        "decode + substring match": decode_and_match,
        "bare pass (ids == eos).any(1)": lambda: (ids == EOS).any(dim=1),
    }
    expected = tensor_native_reward(ids, patterns, EOS)
    for name in list(methods)[:4]:
        if not torch.equal(methods[name]().float(), expected):
            raise AssertionError(f"{name} disagrees with tensor_native_reward")

    # Adversarial: every token is the pattern head; the 16-token pattern never completes.
    adv_ids = torch.full((batch, length), 7, device=dev)
    adv_patterns = torch.tensor([[7] * 15 + [8]] * batch, device=dev)
    adv_lengths = torch.full((batch,), 16, device=dev)
    no_eos = torch.full((batch,), length, device=dev)
    if tensor_native_reward(adv_ids, adv_patterns, EOS).any():
        raise AssertionError("adversarial input must score 0")
    methods["adversarial: tensor_native"] = lambda: tensor_native_reward(adv_ids, adv_patterns, EOS)
    methods["adversarial: column scan"] = lambda: _column_scan(adv_ids, adv_patterns, adv_lengths, no_eos)
    times = measure_interleaved(methods, dev, repeats)
    t = {k: v.min for k, v in times.items()}  # the least disturbed round (see measure_interleaved)
    ratios = {
        "speedup_vs_loop": t["per-row unfold loop (seed)"] / t["tensor_native (list patterns)"],
        "speedup_vs_decode": t["decode + substring match"] / t["tensor_native (list patterns)"],
        "ratio_to_bare_pass": t["tensor_native (padded tensor)"] / t["bare pass (ids == eos).any(1)"],
        "adversarial_vs_scan": t["adversarial: column scan"] / t["adversarial: tensor_native"],
    }
    return {
        "config": {
            "batch": batch,
            "length": length,
            "vocab": vocab,
            "device": device,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "reward_rate": float(expected.mean()),
        "times": {k: asdict(v) for k, v in times.items()},
        "ratios": ratios,
    }
