from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrlhf.rewards import contains as contains_module
from asyncrlhf.rewards import tensor_native_reward
from tests.rewards import reference

EOS = 2


@pytest.fixture(params=["filter", "scan"])
def algorithm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test through both exact algorithms (CPU picks by candidate density)."""
    share = float("inf") if request.param == "filter" else 0.0
    monkeypatch.setattr(contains_module, "_DENSE_CANDIDATE_SHARE", share)
    return request.param


def reward(rows: list[list[int]], patterns: list[list[int]], device: torch.device) -> list[float]:
    ids = torch.tensor(rows, device=device)
    out = tensor_native_reward(ids, [torch.tensor(p, dtype=torch.long) for p in patterns], EOS)
    assert out.dtype == torch.float32 and out.device == ids.device
    return out.tolist()


@pytest.mark.parametrize(
    ("row", "pattern", "expected"),
    [
        ([5, 6, 7, 2, 0], [], 0.0),  # empty pattern
        ([5, 6, 2, 7, 8], [5, 6, 7], 0.0),  # longer than the trimmed row (2 tokens)
        ([5, 6, 7, 8, 9], [8, 9], 1.0),  # no EOS: the whole row counts, up to its end
        ([5, 6, 2, 8, 9], [8, 9], 0.0),  # only after the first EOS
        ([8, 9, 5, 2, 0], [8, 9], 1.0),  # at the very start
        ([5, 8, 9, 2, 0], [8, 9], 1.0),  # ends right before EOS
        ([5, 8, 2, 9, 2], [8, 9], 0.0),  # several EOS: the first one cuts
        ([2, 8, 9, 2, 0], [8, 9], 0.0),  # EOS at position 0: empty response
        ([5, 8, 8, 9, 2], [8, 9], 1.0),  # overlapping partial match then a full one
        ([5, 6, 7, 8, 9], [5, 6, 7, 8, 9], 1.0),  # the whole row
        ([5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 1], 0.0),  # longer than L
        ([5, 6, 2, 8, 9], [6, 2], 0.0),  # a pattern containing EOS never matches
    ],
)
def test_edge_cases(row, pattern, expected, algorithm, device):
    assert reward([row], [pattern], device) == [expected]


def test_heterogeneous_batch(algorithm, device):
    rows = [[5, 6, 7, 2, 0, 0], [7, 7, 7, 7, 7, 7], [2, 5, 6, 0, 0, 0], [9, 8, 9, 8, 2, 9]]
    patterns = [[6, 7], [7, 7, 7, 7, 7, 7], [5], [8, 9, 8]]
    assert reward(rows, patterns, device) == [1.0, 1.0, 0.0, 1.0]


def test_padded_tensor_patterns_equal_list_patterns(algorithm, device):
    ids = torch.tensor([[5, 6, 7, 2], [3, 4, 5, 6], [1, 1, 2, 1]], device=device)
    padded = torch.tensor([[6, 7, -1], [4, 5, 6], [-1, -1, -1]])
    listed = [torch.tensor([6, 7]), torch.tensor([4, 5, 6]), torch.tensor([], dtype=torch.long)]
    assert tensor_native_reward(ids, padded, EOS).tolist() == [1.0, 1.0, 0.0]
    assert tensor_native_reward(ids, listed, EOS).tolist() == [1.0, 1.0, 0.0]


def test_anything_after_the_first_negative_is_padding():
    ids = torch.tensor([[5, 6, 9]])
    assert tensor_native_reward(ids, torch.tensor([[5, 6, -1, 7]]), EOS).tolist() == [1.0]


def test_adversarial_repeated_head_token(algorithm):
    # Every position is a candidate for the pattern head; only the tail decides.
    ids = torch.full((4, 64), 7)
    ids[1, 40] = 8
    ids[2, 10] = 2
    ids[2, 5] = 8  # before the EOS at 10
    patterns = torch.tensor([[7, 7, 7, 8], [7, 7, 7, 8], [7, 8, -1, -1], [7] * 4])
    assert tensor_native_reward(ids, patterns, EOS).tolist() == [0.0, 1.0, 1.0, 1.0]


def test_empty_batch_and_zero_length():
    assert tensor_native_reward(torch.zeros(0, 5, dtype=torch.long), [], EOS).shape == (0,)
    ids = torch.zeros(2, 0, dtype=torch.long)
    assert tensor_native_reward(ids, [torch.tensor([1]), torch.tensor([1])], EOS).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("ids", "patterns", "error", "name"),
    [
        (torch.tensor([1, 2, 3]), [torch.tensor([1])], ValueError, "generated_ids"),
        (torch.ones(2, 3), [torch.tensor([1])] * 2, TypeError, "generated_ids"),
        ([[1, 2]], [torch.tensor([1])], TypeError, "generated_ids"),
        (torch.ones(2, 3, dtype=torch.long), [torch.tensor([1])], ValueError, "answer_patterns"),
        (torch.ones(1, 3, dtype=torch.long), [torch.tensor([[1]])], ValueError, r"answer_patterns\[0\]"),
        (torch.ones(1, 3, dtype=torch.long), [torch.tensor([1.5])], TypeError, r"answer_patterns\[0\]"),
        (torch.ones(1, 3, dtype=torch.long), torch.ones(2, 2, dtype=torch.long), ValueError, "answer_patterns"),
        (torch.ones(1, 3, dtype=torch.long), "12", TypeError, "answer_patterns"),
    ],
)
def test_bad_input_names_the_argument(ids, patterns, error, name):
    with pytest.raises(error, match=name):
        tensor_native_reward(ids, patterns, EOS)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[list[int]], list[list[int]]]:
    b = draw(st.integers(1, 6))
    length = draw(st.integers(1, 14))
    tokens = st.integers(0, 4)  # a tiny vocabulary (EOS = 2) makes matches and EOS common
    rows = draw(st.lists(st.lists(tokens, min_size=length, max_size=length), min_size=b, max_size=b))
    patterns = draw(st.lists(st.lists(tokens, max_size=6), min_size=b, max_size=b))
    return rows, patterns


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from(["filter", "scan"]))
def test_matches_python_reference(batch, algorithm):
    rows, patterns = batch
    expected = [reference.contains(r, p, EOS) for r, p in zip(rows, patterns, strict=True)]
    share = float("inf") if algorithm == "filter" else 0.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contains_module, "_DENSE_CANDIDATE_SHARE", share)
        ids = torch.tensor(rows)
        assert (
            tensor_native_reward(ids, [torch.tensor(p, dtype=torch.long) for p in patterns], EOS).tolist() == expected
        )
        width = max(len(p) for p in patterns)
        padded = torch.tensor([p + [-1] * (width - len(p)) for p in patterns], dtype=torch.long).reshape(
            len(rows), width
        )
        assert tensor_native_reward(ids, padded, EOS).tolist() == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_patterns_spread_over_devices_are_moved_to_the_tokens_device():
    ids = torch.tensor([[5, 6, 7, 2], [3, 4, 5, 6]], device="cuda")
    patterns = [torch.tensor([6, 7]), torch.tensor([4, 5], device="cuda")]  # torch.cat refuses this mix
    assert tensor_native_reward(ids, patterns, EOS).tolist() == [1.0, 1.0]
