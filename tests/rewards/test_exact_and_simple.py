from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrlhf.rewards import exact_match_reward, gpu_reward_simple
from tests.rewards import reference

EOS = 2


@pytest.mark.parametrize(
    ("row", "answer", "expected"),
    [
        ([4, 5, 2, 0], [4, 5], 1.0),  # answer then EOS
        ([4, 5, 6, 2], [4, 5], 0.0),  # extra token before EOS
        ([4, 5, 0, 0], [4, 5], 0.0),  # never stops
        ([4, 2, 5, 2], [4, 5], 0.0),  # the first EOS cuts the answer
        ([2, 4, 5, 2], [], 1.0),  # empty answer, empty response
        ([4, 5, 6, 7], [4, 5, 6, 7], 0.0),  # fills the row: no EOS follows
        ([4, 5, 6, 2], [4, 5, 6, 7, 8], 0.0),  # answer longer than L
    ],
)
def test_exact_match_cases(row, answer, expected, device):
    ids = torch.tensor([row], device=device)
    out = exact_match_reward(ids, [torch.tensor(answer, dtype=torch.long)], EOS)
    assert out.device == ids.device and out.tolist() == [expected]


@pytest.mark.parametrize(
    ("row", "target", "expected"),
    [
        ([3, 9, 2, 0], 9, 1.0),
        ([3, 2, 9, 0], 9, 0.0),  # only after EOS
        ([3, 4, 5, 9], 9, 1.0),  # no EOS at all
        ([2, 9, 9, 9], 9, 0.0),  # EOS at position 0
        ([3, 4, 2, 0], 2, 0.0),  # the EOS itself is never "before" EOS
    ],
)
def test_gpu_reward_simple_cases(row, target, expected, device):
    ids = torch.tensor([row], device=device)
    assert gpu_reward_simple(ids, torch.tensor([target]), EOS).tolist() == [expected]


def test_gpu_reward_simple_rejects_mismatched_targets():
    with pytest.raises(ValueError, match="target_token_ids"):
        gpu_reward_simple(torch.ones(2, 3, dtype=torch.long), torch.tensor([1]), EOS)
    with pytest.raises(TypeError, match="target_token_ids"):
        gpu_reward_simple(torch.ones(1, 3, dtype=torch.long), torch.tensor([1.0]), EOS)


rows_and_answers = st.integers(1, 5).flatmap(
    lambda b: st.tuples(
        st.lists(st.lists(st.integers(0, 4), min_size=6, max_size=6), min_size=b, max_size=b),
        st.lists(st.lists(st.integers(0, 4), max_size=7), min_size=b, max_size=b),
    )
)


@settings(max_examples=200, deadline=None)
@given(rows_and_answers)
def test_exact_and_simple_match_python_reference(batch):
    rows, answers = batch
    ids = torch.tensor(rows)
    expected = [reference.exact(r, a, EOS) for r, a in zip(rows, answers, strict=True)]
    got = exact_match_reward(ids, [torch.tensor(a, dtype=torch.long) for a in answers], EOS)
    assert got.tolist() == expected
    targets = [a[0] if a else 0 for a in answers]
    expected_simple = [reference.target_before_eos(r, t, EOS) for r, t in zip(rows, targets, strict=True)]
    assert gpu_reward_simple(ids, torch.tensor(targets), EOS).tolist() == expected_simple
