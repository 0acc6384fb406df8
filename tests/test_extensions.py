"""Adding a policy loss and an advantage estimator is one file (tests/plugins/toy.py):
a spec names it in ``plugins``, and its loss and estimator are then chosen, validated
and trained with like the built-in ones."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.spec import SpecError, load_spec
from tests.pipelines.conftest import REPO

PLUGIN = str(REPO / "tests" / "plugins" / "toy.py")
SPEC = REPO / "experiments" / "quickstart.yaml"


@pytest.fixture(autouse=True, scope="module")
def _registries_as_they_were():  # type: ignore[no-untyped-def]
    """What the plugin registers is gone after this module: other tests see the built-ins."""
    from asyncrlhf.advantages import registry as advantages
    from asyncrlhf.losses import registry as losses

    live = [losses._REGISTRY, losses._OPTIONS, losses._ROW_SEPARABLE, advantages._REGISTRY]
    saved = [type(registry)(registry) for registry in live]
    yield
    for registry, before in zip(live, saved, strict=True):
        registry.clear()
        registry.update(before)
    for name in [n for n in sys.modules if n.startswith("asyncrlhf_plugin_toy")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _trusted(monkeypatch):  # type: ignore[no-untyped-def]
    """The user opted in to their own plugin (``--trust-code``'s environment variable)."""
    monkeypatch.setenv("ASYNCRLHF_TRUST_CODE", "1")


def toy_spec(*overrides: str):  # type: ignore[no-untyped-def]
    """The user's experiment: the quick start's task and model, the plugin's loss."""
    text = f"""
name: toy
plugins: [{PLUGIN}]
task: {{kind: addition, digits: 2, eval_size: 10}}
rollout: {{group_size: 4, max_new_tokens: 5}}
algorithm: {{name: toy_scaled_pg}}
trainer: {{steps: 3, batch_size: 16}}
orchestrator: {{mode: sync, eval_every: 0}}
"""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "toy.yaml"
        path.write_text(text)
        return load_spec(path, list(overrides))


def test_the_new_loss_and_estimator_are_spec_choices_with_validated_options():
    spec = toy_spec("algorithm.scale=2.5", "algorithm.advantage=toy_sign")
    assert spec.algorithm.name == "toy_scaled_pg" and spec.algorithm.loss_options() == {
        "scale": 2.5,
        "loss_agg": "token-mean",
    }
    with pytest.raises(SpecError, match=r"algorithm.scale: Input should be less than or equal to 10 \(got 11\)"):
        toy_spec("algorithm.scale=11")
    with pytest.raises(SpecError, match=r"algorithm.clip_eps: unknown key for algorithm 'toy_scaled_pg'"):
        toy_spec("algorithm.clip_eps=0.2")
    with pytest.raises(SpecError, match=r"unknown advantage estimator 'nope'.*toy_sign"):
        toy_spec("algorithm.advantage=nope")
    with pytest.raises(SpecError, match=r"algorithm.advantage 'toy_sign' needs rollout.group_size >= 3 \(got 2\)"):
        toy_spec("algorithm.advantage=toy_sign", "rollout.group_size=2")


def test_without_the_plugin_the_name_is_refused_naming_the_registered_ones():
    with pytest.raises(SpecError, match=r"algorithm: name 'no_such_loss' is not a registered policy loss: .*grpo"):
        load_spec(SPEC, ["algorithm.name=no_such_loss"])
    with pytest.raises(SpecError, match=r"plugin 'missing.py' cannot be imported: FileNotFoundError"):
        load_spec(SPEC, ["plugins=[missing.py]"])


def test_a_run_trains_with_the_plugin_loss_and_estimator():
    from pipelines.run import run_experiment

    spec = toy_spec("algorithm.scale=2.0", "algorithm.advantage=toy_sign")
    toy = next(m for name, m in sys.modules.items() if name.startswith("asyncrlhf_plugin_toy"))
    before = dict(toy.CALLS)
    result = run_experiment(spec, track=False)
    assert toy.CALLS["advantage"] - before["advantage"] == 3  # once per trainer batch
    assert toy.CALLS["loss"] > before["loss"]
    assert [s["policy/scale"] for s in result.history.steps] == [2.0, 2.0, 2.0]
    assert all(s["train/signal_rows"] >= 0 for s in result.history.steps)


def test_untrusted_the_plugin_is_refused_and_validate_imports_nothing(monkeypatch, tmp_path):
    """Without the opt-in a spec naming a plugin is refused before anything is imported;
    ``validate`` never imports it, and lists it with what it left unchecked."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    monkeypatch.delenv("ASYNCRLHF_TRUST_CODE")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.py").write_text("import pathlib\npathlib.Path('PWNED').touch()\n")
    (tmp_path / "evil.yaml").write_text("plugins: [evil.py]\nalgorithm: {name: evil_loss, power: 3}\n")
    with pytest.raises(SpecError, match=r"would run code: plugins.0: 'evil.py' \(a Python file\).*--trust-code"):
        load_spec(tmp_path / "evil.yaml")
    result = CliRunner().invoke(app, ["validate", "evil.yaml"])
    assert result.exit_code == 0, result.output
    assert "not imported: would import plugins.0: 'evil.py' (a Python file)" in result.output
    assert "not imported: algorithm.name 'evil_loss' and its options" in result.output
    result = CliRunner().invoke(app, ["run", "evil.yaml"])
    assert result.exit_code == 2 and result.output.count("error:") == 1, result.output
    assert "--trust-code" in result.output
    assert not (tmp_path / "PWNED").exists()
    result = CliRunner().invoke(app, ["validate", "evil.yaml", "--set", "plugins=[]"])
    assert result.exit_code == 2 and "name 'evil_loss' is not a registered policy loss" in result.output


def test_with_trust_code_the_cli_runs_the_plugin(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    monkeypatch.delenv("ASYNCRLHF_TRUST_CODE")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("import pathlib\npathlib.Path('IMPORTED').touch()\n")
    (tmp_path / "mine.yaml").write_text(
        "plugins: [mine.py]\ntask: {kind: addition, digits: 2, eval_size: 10}\nrollout: {group_size: 4}\n"
        "trainer: {steps: 2, batch_size: 16, checkpoint_every: 0}\norchestrator: {mode: sync, eval_every: 0}\n"
        f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow/mlflow.db'}}\n"
    )
    result = CliRunner().invoke(app, ["run", "mine.yaml", "--trust-code"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "IMPORTED").exists()
    import os

    assert os.environ.get("ASYNCRLHF_TRUST_CODE") == "1"  # what Ray's workers and trials inherit
