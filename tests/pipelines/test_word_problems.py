"""A real model directory end to end: a Qwen2 with a BPE tokenizer and a chat template
built here, loaded like a downloaded checkpoint, run on GSM8K-format word problems
with the math verifier through the same path a user's model takes."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from asyncrlhf.models import load_pretrained
from pipelines.run import run_experiment
from pipelines.run.chatmodel import CHAT_TEMPLATE
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO


def test_the_chat_model_directory_loads_like_a_downloaded_one(chat_model_dir):
    model, tokenizer = load_pretrained(chat_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template == CHAT_TEMPLATE
    assert [tokenizer.decode([i]) for i in tokenizer.encode("111", add_special_tokens=False)] == ["1", "1", "1"]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tom has 3 pens."}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nTom has 3 pens.<|im_end|>\n<|im_start|>assistant\n"
    manifest = json.loads((chat_model_dir / "asyncrlhf.json").read_text())
    assert manifest["eval"]["problems"] == 300 and 0.0 <= manifest["eval"]["greedy_accuracy"] <= 1.0


def prompt_lengths(tokenizer, path: Path) -> list[int]:  # type: ignore[no-untyped-def]
    """Each question's prompt length through the chat template (what the task measures)."""
    lengths = []
    for line in path.read_text().splitlines():
        messages = [{"role": "user", "content": json.loads(line)["question"]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lengths.append(len(tokenizer.encode(text, add_special_tokens=False)))
    return lengths


def test_word_problems_runs_on_the_built_model_with_the_verifier(store, chat_model_dir, tmp_path):
    _, tokenizer = load_pretrained(chat_model_dir)
    data = REPO / "experiments" / "data" / "word_problems"
    train, test = prompt_lengths(tokenizer, data / "train.jsonl"), prompt_lengths(tokenizer, data / "test.jsonl")
    limit = sorted(test)[len(test) // 2]  # about half the prompts are longer
    spec = load_spec(
        REPO / "experiments" / "word_problems.yaml",
        [
            f"model.path={chat_model_dir}",
            "trainer.steps=2",
            "trainer.batch_size=16",
            "orchestrator.eval_every=2",
            "tracking.eval_samples=3",
            "runtime.torch_threads=1",
            f"task.max_prompt_tokens={limit}",
        ],
    )
    result = run_experiment(spec)
    client = MlflowClient(store)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    # The prompts over the limit were dropped, counted and logged with the run.
    dropped = sum(n > limit for n in train + test)
    assert 0 < dropped < len(train + test)
    assert run.data.metrics["task/dropped_prompts"] == dropped
    assert run.data.metrics["task/eval_problems"] == sum(n <= limit for n in test)
    assert [m.step for m in client.get_metric_history(result.run_id, "reward/timeouts")] == [1, 2]
    path = client.download_artifacts(result.run_id, "eval/samples.json", str(tmp_path))
    rows = json.loads(Path(path).read_text())["data"]  # problem, step, prompt, answer, output, correct
    assert sorted({row[1] for row in rows}) == [0, 2] and len(rows) == 6
    assert all("####" in row[3] and row[2].endswith("?") for row in rows)  # the raw question, the worked answer
