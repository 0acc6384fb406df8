"""The bad-input cases (``bad_inputs.yaml``, also the table of docs/reliability.md), one by
one: each input exits with the code and the one line the case gives (``…`` stands for
what varies by machine), no traceback, and no MLflow run. The commands run in-process
through the real Typer app."""

from __future__ import annotations

import json
import os
import re
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.sweeps.study import default_storage, driver_lock
from tests.pipelines.conftest import REPO

CASES = yaml.safe_load((Path(__file__).with_name("bad_inputs.yaml")).read_text(encoding="utf-8"))


def setup_files(folder: Path) -> None:
    shutil.copy(REPO / "experiments" / "quickstart.yaml", folder / "quickstart.yaml")
    (folder / "empty.yaml").write_text("# nothing but a comment\n")
    (folder / "twice.yaml").write_text("name: a\ntrainer:\n  lr: 1.0e-4\n  lr: 3.0e-4\n")
    (folder / "specs").mkdir()
    (folder / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    good = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(20)]
    (folder / "null.jsonl").write_text("\n".join([*good[:2], '{"prompt": "1+1=", "answer": null}', *good[2:]]))
    (folder / "one.jsonl").write_text(good[0] + "\n")
    (folder / "huge.jsonl").write_text("\n".join([json.dumps({"prompt": "1" * 200_000, "answer": "2"}), *good]))
    sweep = {"name": "seedless", "base": "quickstart.yaml", "seeds": [], "space": {"trainer.lr": [1e-4, 3e-4]}}
    (folder / "seedless.yaml").write_text(yaml.safe_dump(sweep))
    sweep = {"name": "busy", "base": "quickstart.yaml", "space": {"trainer.lr": [1e-4, 3e-4]}}
    (folder / "busy.yaml").write_text(yaml.safe_dump(sweep))
    (folder / "taken").mkdir()
    (folder / "taken" / "notes.txt").write_text("mine")  # export refuses a non-empty target
    (folder / "missing.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n{"question": "2+2="}\n')
    (folder / "latin1.jsonl").write_bytes('{"question": "caf\xe9", "answer": "2"}\n'.encode("latin-1"))
    (folder / "empty.jsonl").write_text("")
    (folder / "evil.py").write_text("import pathlib\npathlib.Path('PWNED').touch()\n")
    (folder / "evil.yaml").write_text("plugins: [evil.py]\n")
    model_folders(folder)
    (folder / "long.jsonl").write_text(
        "".join(json.dumps({"question": str(i) * 300, "answer": "1"}) + "\n" for i in range(10))
    )


def model_folders(folder: Path) -> None:
    """Copies of the shipped start checkpoint that cannot load: no tokenizer, a garbled or
    truncated weights file, a config that names custom code."""
    from asyncrlhf.models import shipped_policy

    for name in ("notok", "broken", "cut", "custom"):
        shutil.copytree(shipped_policy(), folder / name)
    for tokenizer in ("tokenizer.json", "tokenizer_config.json"):
        (folder / "notok" / tokenizer).unlink()
    weights = folder / "broken" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:8] + b"\xff" * 200 + weights.read_bytes()[208:])
    cut = folder / "cut" / "model.safetensors"
    cut.write_bytes(cut.read_bytes()[:4096])
    config = json.loads((folder / "custom" / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "custom" / "config.json").write_text(json.dumps(config))
    (folder / "custom" / "modeling_evil.py").write_text("import pathlib\npathlib.Path('PWNED').touch()\n")


def test_the_cases_are_there():
    assert len(CASES) >= 15 and all(set(case) == {"command", "exit", "message"} for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["command"].removeprefix("asyncrlhf ")[:60] for c in CASES])
def test_each_bad_input_case_holds(case, store, tmp_path, monkeypatch):
    command, code, message = case["command"].removeprefix("asyncrlhf "), case["exit"], case["message"]
    if "engine=vllm" in command and find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the missing-vLLM line does not apply")
    setup_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    args = [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', command)]
    if args[0] == "sweep" and args[1] == "busy.yaml":  # another driver holds the study
        with driver_lock(default_storage(store), "busy"):
            result = CliRunner().invoke(app, args)
    else:
        result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and len(errors) == 1, result.output
    pattern = ".*".join(re.escape(part) for part in message.split("…"))
    assert re.fullmatch(pattern, errors[0]), f"\n{errors[0]}\n{message}"
    db = Path(store.removeprefix("sqlite:///"))
    if db.exists():
        client = MlflowClient(store)
        assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []
    assert os.getcwd() == str(tmp_path)
    assert not (tmp_path / "PWNED").exists()  # no code the spec names ran
