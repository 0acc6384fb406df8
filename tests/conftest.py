"""Shared fixtures: devices to run tensor code on (CUDA tests skip cleanly without it)."""

from __future__ import annotations

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)
