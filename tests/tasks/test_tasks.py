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
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: missing field 'answer'"):
        JsonlTask(tokenizer, path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JsonlTask(tokenizer, tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "1+1=", "answer": null}', r"bad\.jsonl:3: field 'answer' must be a non-empty string, got null"),
        ('{"prompt": "1+1=", "answer": 2}', r"bad\.jsonl:3: field 'answer' must be a non-empty string, got 2"),
        ('{"prompt": {"a": 1}, "answer": "2"}', r"bad\.jsonl:3: field 'prompt' must be .*got \{\"a\": 1\}"),
        ('{"prompt": "", "answer": "2"}', r"bad\.jsonl:3: field 'prompt' must be a non-empty string"),
        ('{"prompt": "1+1=", "answer": "2", "id": [1]}', r"bad\.jsonl:3: field 'id' must be a string or an integer"),
        ('["1+1=", "2"]', r"bad\.jsonl:3: expected an object"),
        ('{"prompt": "1+1=", "answer": "2",', r"bad\.jsonl:3: not JSON"),
        # "é" and "ü" both encode to <unk>: "é" and "ü" would compare equal as answers.
        (
            '{"prompt": "caf\u00e9=", "answer": "\u00fc"}',
            r"bad\.jsonl:3: field 'prompt' has characters the tokenizer "
            r"cannot represent: 'é'",
        ),
    ],
)
def test_jsonl_refuses_lines_it_cannot_train_on(tmp_path, tokenizer, line, message):
    path = tmp_path / "bad.jsonl"
    good = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(20)]
    path.write_text("\n".join([*good[:2], line, *good[2:]]) + "\n")
    with pytest.raises(ValueError, match=message):
        JsonlTask(tokenizer, path)


def test_jsonl_refuses_files_that_leave_nothing_to_evaluate_or_are_not_utf8(tmp_path, tokenizer):
    one = tmp_path / "one.jsonl"
    one.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"one\.jsonl: 1 problem\(s\) at eval_fraction=0\.1 hold out none.*11 lines"):
        JsonlTask(tokenizer, one)
    assert len(JsonlTask(tokenizer, one, eval_fraction=0.0).eval_problems()) == 0  # no evaluation, asked for
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no evaluation problems"):
        JsonlTask(tokenizer, one, eval_path=empty)
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"prompt": "caf\u00e9", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.jsonl: not UTF-8 text \(byte 0xe9 at offset 15\)"):
        JsonlTask(tokenizer, latin)


def test_a_jsonl_prompt_over_the_limit_is_dropped_and_counted_or_refused(tmp_path, tokenizer):
    """A 200,000-character prompt reached the model and failed the run allocating 40 GB."""
    good = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    lines = [{"prompt": "1" * 200_000, "answer": "2"}, *good]
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    with pytest.warns(UserWarning, match=r"dropped 1 of 21 prompts over max_prompt_tokens=59 \(first: .*jsonl:1\)"):
        task = JsonlTask(tokenizer, path, max_prompt_tokens=59)
    assert task.dropped == 1 and len(task._train) + len(task._eval) == 20
    assert max(len(p.prompt_ids) for p in task.eval_problems()) <= 59
    with pytest.raises(ValueError, match=r"huge.jsonl:1: prompt has 200001 tokens, over max_prompt_tokens=59"):
        JsonlTask(tokenizer, path, max_prompt_tokens=59, long_prompts="refuse")
    assert JsonlTask(tokenizer, path).dropped == 0  # no limit given: the core keeps every prompt


@pytest.mark.parametrize(
    ("asked", "new_tokens", "context", "limit"),
    [
        (None, 5, 64, 59),
        (32, 5, 64, 32),
        (None, 5, None, None),
        (40, 5, None, 40),
        (60, 5, 64, "at most 59 tokens of prompt"),
        (None, 64, 64, "leaves no room for a prompt"),
    ],
)
def test_the_prompt_limit_is_what_the_models_context_leaves(asked, new_tokens, context, limit):
    from pipelines.spec import spec_from_dict
    from pipelines.spec.tasks import prompt_limit

    spec = spec_from_dict({"task": {"max_prompt_tokens": asked}, "rollout": {"max_new_tokens": new_tokens}})
    if isinstance(limit, str):
        with pytest.raises(ValueError, match=limit):
            prompt_limit(spec, context)
    else:
        assert prompt_limit(spec, context) == limit
