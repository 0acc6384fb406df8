from __future__ import annotations

import json

import pytest
import torch

from asyncrlhf.models import build_char_tokenizer
from asyncrlhf.tasks import AdditionTask, JsonlTask, Task


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


def test_addition_problems_are_verifiable_token_ids(tokenizer):
    task = AdditionTask(tokenizer, digits=2, seed=3)
    assert isinstance(task, Task)
    problem = task.problem(37, 45)
    assert problem.prompt == "37+45=" and problem.answer == "82"
    assert problem.prompt_ids[0].item() == tokenizer.bos_token_id
    assert tokenizer.decode(problem.prompt_ids[1:].tolist()) == "37+45="
    assert tokenizer.decode(problem.answer_ids.tolist()) == "82"
    assert problem.answer_ids.dtype == torch.long


def test_held_out_pairs_never_appear_in_training(tokenizer):
    task = AdditionTask(tokenizer, digits=1, seed=0, eval_size=20)
    held_out = {p.prompt for p in task.eval_problems()}
    stream = task.train_problems()
    seen = {next(stream).prompt for _ in range(500)}
    assert len(held_out) == 20 and not held_out & seen


def test_addition_is_seeded(tokenizer):
    first = [p.prompt for p in AdditionTask(tokenizer, seed=1).eval_problems()]
    again = [p.prompt for p in AdditionTask(tokenizer, seed=1).eval_problems()]
    other = [p.prompt for p in AdditionTask(tokenizer, seed=2).eval_problems()]
    assert first == again != other


def test_digits_must_be_positive(tokenizer):
    with pytest.raises(ValueError, match="digits"):
        AdditionTask(tokenizer, digits=0)


def test_jsonl_task(tmp_path, tokenizer):
    path = tmp_path / "train.jsonl"
    rows = [{"prompt": f"{i}*2=", "answer": str(2 * i)} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = JsonlTask(tokenizer, path, eval_fraction=0.25, seed=0)
    assert len(task.eval_problems()) == 5
    problem = next(task.train_problems())
    assert tokenizer.decode(problem.answer_ids.tolist()) == str(2 * int(problem.prompt.split("*")[0]))


def test_jsonl_errors_name_the_line(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "c"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        JsonlTask(tokenizer, path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JsonlTask(tokenizer, tmp_path / "missing.jsonl")
