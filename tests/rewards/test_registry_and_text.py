from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrlhf.rewards import (
    CompositeReward,
    RewardTerm,
    available_rewards,
    get_reward,
    make_text_reward,
    register_reward,
    tensor_native_reward,
    text_reward,
)

EOS = 2


def ends_with_digit(generated_ids: torch.Tensor, answers: object, eos_token_id: int) -> torch.Tensor:
    """A user reward, reachable by dotted path."""
    return (generated_ids[:, -1] >= 10).float()


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": EOS, **{f"w{i}": i for i in range(3, 20)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def test_builtin_kinds_are_registered():
    assert {"contains", "exact_match", "target_token", "terminated"} <= set(available_rewards())
    assert get_reward("contains") is tensor_native_reward


def test_dotted_paths_resolve_both_spellings():
    assert get_reward("tests.rewards.test_registry_and_text:ends_with_digit") is ends_with_digit
    assert get_reward("tests.rewards.test_registry_and_text.ends_with_digit") is ends_with_digit


@pytest.mark.parametrize("kind", ["no_such_reward", "tests.rewards.nothing:here", "math:pi"])
def test_unknown_kinds_fail_clearly(kind):
    with pytest.raises(ValueError, match="reward kind"):
        CompositeReward([RewardTerm(kind)])


def test_register_refuses_a_second_function_under_one_name():
    with pytest.raises(ValueError, match="already registered"):
        register_reward("contains")(ends_with_digit)


def test_composite_sums_weighted_terms():
    ids = torch.tensor([[4, 5, 2, 0], [4, 9, 9, 9], [7, 2, 0, 0]])
    answers = [torch.tensor([4, 5])] * 3
    reward = CompositeReward(
        [RewardTerm("exact_match", 1.0), RewardTerm("contains", 0.5), RewardTerm("terminated", -0.25)]
    )
    # row 0: exact 1 + contains 0.5 − terminated 0.25; row 1: none; row 2: terminated only.
    assert reward(ids, answers, EOS).tolist() == pytest.approx([1.25, 0.0, -0.25])
    assert set(reward.components(ids, answers, EOS)) == {"exact_match", "contains", "terminated"}
    target = CompositeReward([RewardTerm("target_token")])
    assert target(ids, answers, EOS).tolist() == [1.0, 1.0, 0.0]


def test_text_reward_cuts_at_eos_and_decodes(tokenizer):
    ids = torch.tensor([[3, 4, 2, 5], [3, 5, 6, 7]])
    out = text_reward(ids, tokenizer, lambda text, ref: float(text == ref), references=["w3 w4", "w3 w5 w6 w7"])
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 1.0]
    fn = make_text_reward(tokenizer, lambda text, ref: float(ref in text))
    assert fn(ids, [torch.tensor([4]), "w9"], EOS).tolist() == [1.0, 0.0]


def test_text_reward_rejects_mismatched_references(tokenizer):
    with pytest.raises(ValueError, match="references"):
        text_reward(torch.ones(2, 2, dtype=torch.long), tokenizer, lambda t, r: 0.0, references=["a"])


def test_a_broken_reward_module_is_one_clear_error(tmp_path, monkeypatch):
    """A syntax error (with its file and line) or an exception at import: a ValueError
    naming the kind, never a traceback out of spec validation."""
    (tmp_path / "broken_syntax.py").write_text("def score(:\n")
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ValueError,
        match=r"reward kind 'broken_syntax.score': importing 'broken_syntax' failed: "
        r"SyntaxError: .*broken_syntax\.py, line 1",
    ):
        get_reward("broken_syntax.score")
    with pytest.raises(ValueError, match="importing 'raises_at_import' failed: RuntimeError: no GPU here"):
        get_reward("raises_at_import:score")
    with pytest.raises(ValueError, match=r"module 'tests\.rewards\.reference' has no attribute 'nope'"):
        get_reward("tests.rewards.reference:nope")
