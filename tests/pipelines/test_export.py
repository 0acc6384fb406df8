"""``asyncrlhf export`` writes its target and nothing else (issue: reliability, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run import run_experiment
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO

TINY = ["trainer.steps=2", "trainer.batch_size=32", "orchestrator.eval_every=0", "task.eval_size=20"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    store = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    ids = [
        run_experiment(
            load_spec(REPO / "experiments" / "quickstart.yaml", [*TINY, f"seed={seed}", f"tracking.uri={store}"])
        ).run_id
        for seed in (0, 1)
    ]
    return store, ids


def export(store: str, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["export", *args, "--uri", store])


def test_export_never_touches_a_neighbouring_folder(runs, tmp_path):
    """``mkdir t/policy; echo notes > t/policy/notes.txt; export --out t/my-policy``
    removed ``t/policy`` and moved ``notes.txt`` into the export."""
    store, (a, _) = runs
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "notes.txt").write_text("notes")
    done = export(store, a, "--out", str(tmp_path / "my-policy"))
    assert done.exit_code == 0, done.output
    assert (tmp_path / "policy" / "notes.txt").read_text() == "notes"
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["notes.txt"]
    exported = {p.name for p in (tmp_path / "my-policy").iterdir()}
    assert "config.json" in exported and "model.safetensors" in exported and "notes.txt" not in exported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-policy", "policy"]  # no staging left behind


def test_a_second_export_beside_the_first_keeps_it(runs, tmp_path, monkeypatch):
    """``export A --out policy; export B --out policy-b`` removed ``./policy``."""
    store, (a, b) = runs
    monkeypatch.chdir(tmp_path)
    assert export(store, a, "--out", "policy").exit_code == 0
    first = (tmp_path / "policy" / "model.safetensors").read_bytes()
    assert export(store, b, "--out", "policy-b").exit_code == 0
    assert (tmp_path / "policy" / "model.safetensors").read_bytes() == first
    assert (tmp_path / "policy-b" / "model.safetensors").read_bytes() != first  # another seed, other weights


def test_an_existing_target_is_replaced_only_when_asked(runs, tmp_path):
    store, (a, b) = runs
    out = tmp_path / "out"
    assert export(store, a, "--out", str(out)).exit_code == 0
    first = (out / "model.safetensors").read_bytes()
    refused = export(store, b, "--out", str(out))
    assert refused.exit_code == 2 and "exists and is not empty" in refused.output
    assert (out / "model.safetensors").read_bytes() == first
    assert export(store, b, "--out", str(out), "--overwrite").exit_code == 0
    assert (out / "model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_export_leaves_nothing(runs, tmp_path):
    store, _ = runs
    done = export(store, "0" * 32, "--out", str(tmp_path / "nothing"))
    assert done.exit_code == 2 and "has no policy to export" in done.output
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("x")
    done = export(store, "0" * 32, "--out", str(tmp_path / "a-file"))
    assert done.exit_code == 2 and "is a file" in done.output and Path(tmp_path / "a-file").read_text() == "x"
