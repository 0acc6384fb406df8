"""Tensor-native matching with a BPE tokenizer trained here with `tokenizers`: one answer
tokenizes differently alone, after the prompt, and with a leading space. With the
task's variants, exact match on tokens agrees with decoding and comparing text."""

from __future__ import annotations

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from asyncrlhf.rewards import DecodedReward, exact_match_reward, tensor_native_reward
from asyncrlhf.tasks.base import answer_variants, encode_problem


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    """Byte-level BPE over arithmetic word problems: merges digits and ' 47'-style words."""
    rng = random.Random(0)
    corpus = []
    for _ in range(3000):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        corpus.append(f"Tom has {a} apples and buys {b} more. How many now? {a + b}")
        corpus.append(f"{a}+{b}={a + b}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<s>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def test_one_answer_has_several_tokenizations(bpe):
    variants = answer_variants(bpe, "How many now?", "47")
    assert len(variants) >= 2 and all(bpe.decode(v).strip() == "47" for v in variants)
    assert variants[0] == bpe.encode("47", add_special_tokens=False)


def test_tensor_native_and_decoded_rewards_agree_on_a_bpe_batch(bpe):
    rng = random.Random(1)
    eos, rows, answers, texts = bpe.eos_token_id, [], [], []
    for _ in range(64):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        prompt, answer = f"Tom has {a} apples and buys {b} more. How many now?", str(a + b)
        problem = encode_problem(bpe, "p", prompt, answer, variants=True)
        options = [v.tolist() for v in problem.patterns] + [bpe.encode(str(a + b + 1), add_special_tokens=False)]
        response = rng.choice(options)  # a right tokenization, or a wrong answer
        rows.append([*response, eos])
        answers.append(problem.patterns)
        texts.append(answer)
    width = max(map(len, rows))
    ids = torch.tensor([r + [bpe.pad_token_id] * (width - len(r)) for r in rows])
    tensor = exact_match_reward(ids, answers, eos)
    decoded, _ = DecodedReward(bpe, "asyncrlhf.rewards.verify:exact_text", workers=0)(ids, texts, eos)
    assert torch.equal(tensor, decoded) and 0 < tensor.mean() < 1
    plain = exact_match_reward(ids, [a[0] if isinstance(a, list) else a for a in answers], eos)
    assert plain.sum() < tensor.sum()  # without the variants, right answers were scored wrong
    assert torch.equal(tensor_native_reward(ids, answers, eos), tensor)  # whole responses: contains = exact


def test_a_split_the_variants_do_not_list_is_only_caught_by_decoding(bpe):
    """The known limit: a policy may emit an answer in pieces no tokenizer call produces
    ('4' then '7' where the vocabulary has '47'); the decoded reward still reads it."""
    pieces = [bpe.convert_tokens_to_ids(c) for c in "47"]
    ids = torch.tensor([[*pieces, bpe.eos_token_id]])
    problem = encode_problem(bpe, "p", "How many now?", "47", variants=True)
    assert exact_match_reward(ids, [problem.patterns], bpe.eos_token_id).item() == 0.0
    decoded, _ = DecodedReward(bpe, "asyncrlhf.rewards.verify:exact_text", workers=0)(ids, ["47"], bpe.eos_token_id)
    assert decoded.item() == 1.0
