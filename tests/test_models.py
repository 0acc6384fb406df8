from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from asyncrlhf.models import (
    WarmStartConfig,
    build_char_tokenizer,
    load_pretrained,
    pretrained_policy,
    token_logprobs,
    weights_checksum,
)
from tests.helpers import SMALL, small_model


def test_char_tokenizer_round_trips_through_save_pretrained(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = loaded.encode("37+45=82", add_special_tokens=False)
    assert len(ids) == 8 and loaded.decode(ids) == "37+45=82"
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_warm_start_is_cached_by_config_and_loads_back(tmp_path):
    warm = WarmStartConfig(steps=3, batch_size=8)
    path = pretrained_policy(SMALL, warm, cache=tmp_path)
    assert pretrained_policy(SMALL, warm, cache=tmp_path) == path  # cached, not rebuilt
    assert pretrained_policy(SMALL, WarmStartConfig(steps=4, batch_size=8), cache=tmp_path) != path
    model, tokenizer = load_pretrained(path)
    assert tokenizer.eos_token_id == 2
    assert sum(p.numel() for p in model.parameters()) < 100_000


def test_load_pretrained_refuses_a_non_model_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_pretrained(tmp_path)


def test_weights_checksum_sees_any_change():
    model, _ = small_model()
    before = weights_checksum(model)
    assert weights_checksum(model.state_dict()) == before
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-6
    assert weights_checksum(model) != before


def test_token_logprobs_apply_the_temperature():
    logits = torch.tensor([[2.0, 0.0]])
    token = torch.tensor([0])
    assert token_logprobs(logits, token, 1.0).item() == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())
    assert token_logprobs(logits, token, 2.0).item() == pytest.approx(torch.log_softmax(logits / 2, -1)[0, 0].item())
