"""Dataset files through Hugging Face ``datasets``: JSONL and Parquet alike, prompts
formatted exactly as ``apply_chat_template`` formats them, over-long prompts dropped
and counted or refused, and bad files refused naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrlhf.models import build_char_tokenizer
from asyncrlhf.tasks.dataset import DatasetTask

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }} | {% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


@pytest.fixture
def tokenizer():  # type: ignore[no-untyped-def]
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def write_jsonl(path, records) -> str:  # type: ignore[no-untyped-def]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


GSM = [
    {"question": f"Tom has {i} apples and buys 3. How many?", "answer": f"{i} + 3 = {i + 3}. #### {i + 3}"}
    for i in range(40)
]


def test_chat_template_prompts_are_exactly_apply_chat_template(tokenizer, tmp_path):
    task = DatasetTask(
        tokenizer,
        write_jsonl(tmp_path / "gsm.jsonl", GSM),
        "question",
        "answer",
        system_prompt="Answer after ####.",
        eval_fraction=0.25,
    )
    problems = task.eval_problems()
    assert len(problems) == 10 and len(task._train) == 30
    for p in problems:
        messages = [{"role": "system", "content": "Answer after ####."}, {"role": "user", "content": p.prompt}]
        want = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert p.prompt_ids.tolist() == list(want)
        assert tokenizer.decode(p.prompt_ids).endswith(" | <s>assistant: ")
    plain = DatasetTask(build_char_tokenizer(), str(tmp_path / "gsm.jsonl"), "question", "answer")  # no template
    first = plain.eval_problems()[0]
    assert first.prompt_ids.tolist() == [1, *build_char_tokenizer().encode(first.prompt, add_special_tokens=False)]


def test_parquet_and_jsonl_give_the_same_problems(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(GSM), tmp_path / "gsm.parquet")
    a = DatasetTask(tokenizer, write_jsonl(tmp_path / "gsm.jsonl", GSM), "question", "answer")
    b = DatasetTask(tokenizer, str(tmp_path / "gsm.parquet"), "question", "answer")
    assert [(p.prompt, p.answer, p.prompt_ids.tolist()) for p in a.eval_problems()] == [
        (p.prompt, p.answer, p.prompt_ids.tolist()) for p in b.eval_problems()
    ]


def test_long_prompts_are_dropped_and_counted_or_refused(tokenizer, tmp_path):
    records = [*GSM[:30], *({"question": "x" * 500, "answer": "1"} for _ in range(5))]
    path = write_jsonl(tmp_path / "long.jsonl", records)
    with pytest.warns(UserWarning, match="dropped 5 of 35 prompts over max_prompt_tokens=80"):
        task = DatasetTask(tokenizer, path, "question", "answer", max_prompt_tokens=80)
    assert task.dropped == 5 and all(len(p.prompt_ids) <= 80 for p in task.eval_problems())
    with pytest.raises(ValueError, match=r"long.jsonl:31: prompt has \d+ tokens, over max_prompt_tokens=80"):
        DatasetTask(tokenizer, path, "question", "answer", max_prompt_tokens=80, long_prompts="refuse")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "a?", "answer": "1"}\n{"question": "b?"}\n', r"bad.jsonl:2: missing field 'answer'"),
        ('{"q": "a?", "answer": "1"}\n', r"bad.jsonl: no field 'question' in any record \(fields: q, answer\)"),
        (b'{"question": "caf\xe9", "answer": "1"}\n', r"bad.jsonl: not UTF-8 text \(byte 0xe9 at offset 17\)"),
        ("\n\n", r"bad.jsonl: empty file \(no records\)"),
        ('{"question": "a?", "answer": 1}\n', r"bad.jsonl:1: field 'answer' must be a non-empty string, got 1"),
        (
            '{"question": "a?", "answer": "1\\n2"}\n',
            r"bad.jsonl:1: field 'answer' has characters the tokenizer cannot ",
        ),
    ],
)
def test_bad_files_are_refused_naming_file_line_and_field(tokenizer, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        DatasetTask(tokenizer, str(path), "question", "answer")


def test_the_shipped_word_problems_are_the_generators_output(tmp_path):
    from asyncrlhf.tasks.word_problems import write_splits

    shipped = Path(__file__).resolve().parents[2] / "experiments" / "data" / "word_problems"
    write_splits(tmp_path)
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
    train = {json.loads(line)["question"] for line in (shipped / "train.jsonl").read_text().splitlines()}
    test = {json.loads(line)["question"] for line in (shipped / "test.jsonl").read_text().splitlines()}
    assert len(train) == 4000 and len(test) == 300 and not train & test
