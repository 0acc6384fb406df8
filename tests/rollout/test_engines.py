"""One contract for every engine, then HFEngine specifics."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from asyncrlhf.rollout import HFEngine, RolloutEngine, Sampling, StubEngine, VLLMEngine
from asyncrlhf.rollout.vllm import vllm_available
from tests.helpers import small_model

PROMPTS = [torch.tensor([1, 10, 11]), torch.tensor([1, 12])]


class EngineContract:
    def make(self) -> RolloutEngine:
        raise NotImplementedError

    def test_protocol_and_prompt_major_order(self):
        engine = self.make()
        assert isinstance(engine, RolloutEngine)
        samples = engine.generate(PROMPTS, num_samples=3)
        assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
        for s in samples:
            assert s.response_ids.dim() == 1 and s.response_ids.dtype == torch.long
            assert s.logprobs.shape == s.response_ids.shape and s.logprobs.dtype == torch.float32
            assert (s.logprobs <= 0).all()
            assert s.policy_version == engine.version

    def test_async_variant_samples_what_the_sync_call_samples(self):
        samples = asyncio.run(self.make().agenerate(PROMPTS, num_samples=2))
        expected = self.make().generate(PROMPTS, num_samples=2)  # a fresh engine: the same seed
        assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
        for got, want in zip(samples, expected, strict=True):
            assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.logprobs, want.logprobs)

    def test_load_weights_sets_the_version(self):
        engine = self.make()
        state = self.weights()
        engine.load_weights(state, version=7)
        assert engine.version == 7
        assert all(s.policy_version == 7 for s in engine.generate(PROMPTS))

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(2)}

    def test_bad_prompts(self):
        engine = self.make()
        with pytest.raises(ValueError, match="prompts"):
            engine.generate([])
        with pytest.raises(ValueError, match=r"prompts\[0\]"):
            engine.generate([torch.tensor([[1, 2]])])
        with pytest.raises(ValueError, match="num_samples"):
            engine.generate(PROMPTS, num_samples=0)


class TestStubEngine(EngineContract):
    def make(self) -> StubEngine:
        return StubEngine(vocab_size=16, max_new_tokens=5)


class TestHFEngine(EngineContract):
    def make(self) -> HFEngine:
        model, tokenizer = small_model()
        self._model = model
        return HFEngine(
            model, tokenizer.eos_token_id, tokenizer.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=0
        )

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._model.state_dict().items()}


def test_hf_engine_is_reproducible_and_ignores_the_global_rng():
    model, tok = small_model()
    a = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=5).generate(
        PROMPTS, 4
    )
    torch.manual_seed(123)  # the global RNG must not matter
    torch.rand(10)
    b = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=5).generate(
        PROMPTS, 4
    )
    assert all(torch.equal(x.response_ids, y.response_ids) for x, y in zip(a, b, strict=True))


def test_hf_engine_stops_rows_at_eos_and_pads_nothing_into_responses():
    model, tok = small_model()
    vocab, hidden = model.lm_head.weight.shape
    head = torch.nn.Linear(hidden, vocab, bias=True)
    with torch.no_grad():  # uniform logits, EOS with probability 1/2 at every position
        head.weight.zero_()
        head.bias.zero_()
        head.bias[tok.eos_token_id] = math.log(vocab - 1)
    model.lm_head = head
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=8), seed=0)
    samples = engine.generate(PROMPTS, 8)
    lengths = []
    for s in samples:
        eos_at = (s.response_ids == tok.eos_token_id).nonzero().flatten().tolist()
        assert eos_at in ([], [s.response_ids.shape[0] - 1])  # EOS only as the last token kept
        assert eos_at or s.response_ids.shape[0] == 8  # no EOS: the row ran to max_new_tokens
        lengths.append(s.response_ids.shape[0])
    # Rows end at different lengths in the same batch (so the check above saw real EOS stops).
    assert sum(length < 8 for length in lengths) >= 4 and len(set(lengths)) >= 3


def test_hf_engine_temperature_and_top_p_validation():
    model, tok = small_model()
    with pytest.raises(ValueError, match="temperature"):
        HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(top_p=0.0))


def test_top_p_keeps_only_the_nucleus():
    model, tok = small_model()
    engine = HFEngine(
        model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=4, top_p=1e-6), seed=0
    )
    greedy = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=4, temperature=0.0))
    sampled, argmax = engine.generate(PROMPTS, 2), greedy.generate(PROMPTS, 2)
    for s, g in zip(sampled, argmax, strict=True):
        assert torch.equal(s.response_ids, g.response_ids)  # a tiny nucleus is the argmax
        assert torch.allclose(s.logprobs, torch.zeros_like(s.logprobs))  # of a one-token distribution


@pytest.mark.skipif(vllm_available(), reason="vllm installed: the missing-vllm error does not apply")
def test_vllm_engine_without_vllm_says_how_to_get_it():
    with pytest.raises(ImportError, match="pip install vllm"):
        VLLMEngine("some/model")
