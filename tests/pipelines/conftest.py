"""Pipeline tests write to temporary MLflow stores only, never to ./mlflow."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    """A fresh SQLite tracking URI, also exported for subprocesses."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def cli() -> list[str]:
    """The installed ``asyncrlhf`` console script (the real entry point)."""
    script = Path(sys.executable).with_name("asyncrlhf")
    found = str(script) if script.exists() else shutil.which("asyncrlhf")
    assert found, "the asyncrlhf console script is not installed (pip install -e .)"
    return [found]


def env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A Qwen2 chat model with its BPE tokenizer, as ``asyncrlhf chat-model`` builds it,
    with a 5-step warm start (the shipped word-problem data)."""
    from pipelines.run.chatmodel import DATA, build_chat_model

    out = tmp_path_factory.mktemp("chat") / "word-problems"
    build_chat_model(out, REPO / DATA / "train.jsonl", REPO / DATA / "test.jsonl", steps=5, batch_size=16)
    return out
