"""Shared fixtures: devices to run tensor code on (CUDA tests skip cleanly without it)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# CI replays the same examples every run (a failure there is reproducible); local runs
# keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)
