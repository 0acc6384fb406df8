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

# tests/plugins/ holds a user's extension files: imported by the specs that name them
# (and then unregistered), never collected, so the registries hold only the built-ins.
collect_ignore = ["plugins"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nightly",
        action="store_true",
        help="also run the tests marked nightly (CI leaves them to .github/workflows/nightly-tests.yml)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``nightly`` skip, saying how to run them, unless ``--nightly`` is given."""
    if config.getoption("--nightly"):
        return
    skip = pytest.mark.skip(reason="nightly tier: pytest --nightly runs it (the nightly workflow does)")
    for item in items:
        if "nightly" in item.keywords:
            item.add_marker(skip)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(scope="session")
def ray_cluster():  # type: ignore[no-untyped-def]
    """One local 2-CPU Ray cluster for the whole session (started on first use)."""
    import logging

    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
