"""The held-out evaluation as an MLflow table: per evaluation step, each logged problem's
prompt, answer, greedy output and whether it was correct (``eval/samples.json``, shown in
the run's Artifacts and in the experiment's Evaluation view)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrlhf.orchestration.evaluate import EvalCallback, Evaluation
from asyncrlhf.tasks.base import Problem

__all__ = ["TABLE_FILE", "logged_until", "table_callback", "table_rows"]

TABLE_FILE = "eval/samples.json"
Rows = dict[str, list[Any]]


def table_rows(
    step: int, evaluation: Evaluation, problems: Sequence[Problem], decode: Callable[[list[int]], str], limit: int
) -> Rows:
    """The first ``limit`` problems' rows (the same problems at every step, so a problem
    can be followed across steps), as columns."""
    n = min(limit, len(evaluation.correct))
    return {
        # First: MLflow's table comparison (the runs page's third view) groups rows by the
        # first column, so each (step, problem) is one row with every run's output beside it.
        "problem": [f"step {step}: {p.prompt}" for p in problems[:n]],
        "step": [step] * n,
        "prompt": [p.prompt for p in problems[:n]],
        "answer": [p.answer for p in problems[:n]],
        "output": [decode(r) for r in evaluation.responses[:n]],
        "correct": evaluation.correct[:n],
    }


def table_callback(
    problems: Sequence[Problem], tokenizer: Any, limit: int, log: Callable[[int, Rows], None]
) -> EvalCallback | None:
    """An ``on_eval`` for an orchestrator that decodes each evaluation into rows for
    ``log``; None when no row is wanted."""
    if limit <= 0 or not problems:
        return None

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def on_eval(step: int, evaluation: Evaluation) -> None:
        log(step, table_rows(step, evaluation, problems, decode, limit))

    return on_eval


def logged_until(client: Any, run_id: str) -> int:
    """The last step already in the run's table (-1: none), so a resumed run that repeats
    an evaluation does not add its rows twice."""
    import json
    import tempfile

    folder = TABLE_FILE.rsplit("/", 1)[0]
    if TABLE_FILE not in {a.path for a in client.list_artifacts(run_id, folder)}:
        return -1
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-") as tmp:
        table = json.loads(Path(client.download_artifacts(run_id, TABLE_FILE, tmp)).read_text())
    column = table["columns"].index("step")
    return max((int(row[column]) for row in table["data"]), default=-1)
