"""Micro-batches (``OptimConfig.micro_batch_size``) give the update of the whole
mini-batch, for every registered objective and aggregation (M2PO's batch-wide mask and
the trust region's budget included), in float64."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrlhf.training import TrainerWorker
from tests.training.test_sharded import CASES, _batch, _model, _steps, _trainer


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_micro_batches_give_the_mini_batch_update(case, micro):
    torch.set_num_threads(1)
    model, tokenizer = _model(torch.float64)
    batch = _batch(model, tokenizer)
    results = []
    for size in (None, micro):
        name, objective, options, optim, skip, reference = case
        case_with = (name, objective, options, {**optim, "micro_batch_size": size}, skip, reference)
        trainer = _trainer(TrainerWorker, copy.deepcopy(model), tokenizer, case_with, share_prompts=False)
        metrics = [trainer.step(batch) for _ in range(_steps(torch.float64))]
        results.append((metrics, trainer.state_dict()))
    (whole, whole_state), (parts, parts_state) = results
    for one, many in zip(whole, parts, strict=True):
        assert one.keys() == many.keys()
        for key, value in one.items():
            assert many[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (case[0], key)
    moved = max(float((whole_state[k] - model.state_dict()[k]).abs().max()) for k in whole_state)
    assert moved > 1e-3
    for key, value in whole_state.items():
        torch.testing.assert_close(parts_state[key], value, rtol=1e-9, atol=1e-9, msg=f"{case[0]}: {key}")
