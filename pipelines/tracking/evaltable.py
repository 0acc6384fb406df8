"""The held-out evaluation as an MLflow table: per evaluation step, each logged problem's
prompt, reference answer, greedy output and whether it was correct, the newest evaluation
first: ``eval/samples.json`` (the runs page's table comparison, one row per problem with
each run's output beside it) and ``eval/samples.html`` (one compact line per problem, in
the run's Artifacts tab)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrlhf.orchestration.evaluate import EvalCallback, Evaluation
from asyncrlhf.tasks.base import Problem

__all__ = ["HTML_FILE", "TABLE_FILE", "EvalTable", "logged_step", "table_callback", "table_rows"]

TABLE_FILE, HTML_FILE = "eval/samples.json", "eval/samples.html"
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
        # The reference is in it too: the comparison shows only that column and the outputs.
        "problem": [f"step {step}: {p.prompt} (answer {p.answer})" for p in problems[:n]],
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


class EvalTable:
    """A run's evaluation rows, the newest evaluation first, written whole at each
    evaluation (MLflow's ``log_table`` would append them, the oldest first)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.columns: list[str] = []
        self.data: list[list[Any]] = []  # rows, newest evaluation first

    def load(self) -> int:
        """Read what the run's table holds already (a resumed run); its last step (-1: none)."""
        table = _download(self.client, self.run_id)
        if table is not None:
            self.columns, self.data = table["columns"], table["data"]
        return logged_step(self.columns, self.data)

    def add(self, rows: Rows) -> None:
        """Put one evaluation's rows first and write both files."""
        import warnings

        self.columns = self.columns or list(rows)
        new = [list(row) for row in zip(*(rows[c] for c in self.columns), strict=True)]
        first = not self.data
        self.data = new + self.data
        if first:  # log_table also tags the run, so the runs page offers the table comparison
            with warnings.catch_warnings():  # MLflow's own pandas 3 deprecation, nothing of ours
                warnings.filterwarnings("ignore", message=".*select_dtypes.*")
                self.client.log_table(self.run_id, data=rows, artifact_file=TABLE_FILE)
        else:
            self.client.log_dict(self.run_id, {"columns": self.columns, "data": self.data}, TABLE_FILE)
        self.client.log_text(self.run_id, self.html(), HTML_FILE)

    def html(self) -> str:
        """Step, prompt, reference, output and a mark, one line a problem, newest first."""
        import html

        index = {c: self.columns.index(c) for c in ("step", "prompt", "answer", "output", "correct")}
        lines = []
        for row in self.data:
            step, prompt, answer, output, correct = (row[index[c]] for c in index)
            mark = '<td class="ok">✓</td>' if correct else '<td class="no">✗</td>'
            cells = "".join(f"<td>{html.escape(str(v))}</td>" for v in (step, prompt, answer, output))
            lines.append(f"<tr>{cells}{mark}</tr>")
        style = (
            "body{font:13px system-ui,sans-serif;margin:8px}table{border-collapse:collapse}"
            "td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:left;white-space:pre}"
            "th{position:sticky;top:0;background:#fafafa}.ok{color:#1a7f37}.no{color:#cf222e}"
        )
        head = "<tr><th>step</th><th>prompt</th><th>answer</th><th>output</th><th></th></tr>"
        return f"<!doctype html><meta charset=utf-8><style>{style}</style><table>{head}{''.join(lines)}</table>\n"


def logged_step(columns: list[str], data: list[list[Any]]) -> int:
    if "step" not in columns:
        return -1
    column = columns.index("step")
    return max((int(row[column]) for row in data), default=-1)


def _download(client: Any, run_id: str) -> dict[str, Any] | None:
    import json
    import tempfile

    folder = TABLE_FILE.rsplit("/", 1)[0]
    if TABLE_FILE not in {a.path for a in client.list_artifacts(run_id, folder)}:
        return None
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-") as tmp:
        return json.loads(Path(client.download_artifacts(run_id, TABLE_FILE, tmp)).read_text())
