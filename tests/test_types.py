from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.types import Experience, collate


def exp(prompt: list[int], response: list[int], version: int = 0, advantage: float | None = None) -> Experience:
    logprobs = -torch.arange(1, len(response) + 1, dtype=torch.float32) / 10
    return Experience(torch.tensor(prompt), torch.tensor(response), logprobs, 1.0, version, "p", advantage)


def test_collate_left_pads_prompts_and_right_pads_responses():
    batch = collate([exp([5, 6, 7], [8]), exp([9], [10, 11, 12], version=3, advantage=0.5)], pad_token_id=0)
    assert batch.prompt_width == 3
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 0, 0], [0, 0, 9, 10, 11, 12]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]
    assert batch.response_mask.tolist() == [[True, False, False], [True, True, True]]
    assert batch.old_logprobs[1].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch.old_logprobs[0, 1:].tolist() == [0.0, 0.0]
    assert batch.policy_versions.tolist() == [0, 3]
    assert math.isnan(batch.advantages[0].item()) and batch.advantages[1].item() == 0.5
    assert len(batch) == 2


def test_response_columns_line_up_with_next_token_logits():
    # Logits at columns P − 1 … P + R − 2 predict response tokens: check with input_ids itself.
    batch = collate([exp([1, 2], [3, 4]), exp([5], [6])], pad_token_id=0)
    p, r = batch.prompt_width, batch.response_ids.shape[1]
    assert batch.input_ids[:, p : p + r].tolist() == batch.response_ids.tolist()


def test_experience_validates_its_fields():
    with pytest.raises(ValueError, match="logprobs"):
        Experience(torch.tensor([1]), torch.tensor([2, 3]), torch.tensor([0.0]), 0.0, 0, "p")
    with pytest.raises(TypeError, match="response_ids"):
        Experience(torch.tensor([1]), torch.tensor([2.0]), torch.tensor([0.0]), 0.0, 0, "p")
    with pytest.raises(ValueError, match="prompt_ids"):
        Experience(torch.tensor([[1]]), torch.tensor([2]), torch.tensor([0.0]), 0.0, 0, "p")
    with pytest.raises(TypeError, match="policy_version"):
        Experience(torch.tensor([1]), torch.tensor([2]), torch.tensor([0.0]), 0.0, 1.5, "p")


def test_collate_refuses_an_empty_list():
    with pytest.raises(ValueError, match="experiences"):
        collate([], pad_token_id=0)


def test_pad_rows_is_pad_sequence_on_either_side():
    from torch.nn.utils.rnn import pad_sequence

    from asyncrlhf.types import pad_rows

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 50, (int(n),), generator=g) for n in torch.randint(1, 20, (64,), generator=g)]
    for side in ("left", "right"):
        expected = pad_sequence(rows, batch_first=True, padding_value=7, padding_side=side)
        assert torch.equal(pad_rows(rows, 7, left=side == "left"), expected)
