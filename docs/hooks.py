"""MkDocs hooks: tables rendered from the data the tests run, so the site cannot drift
from what is tested. ``<!-- bad-input cases -->`` becomes the table of
``tests/pipelines/bad_inputs.yaml``; ``<!-- README.md -->`` and ``<!-- CHANGELOG.md -->``
the repository's README (the front page) and changelog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- bad-input cases -->"


def _cell(text: Any) -> str:
    return "`" + str(text).replace("|", "\\|") + "`"


def bad_input_table() -> str:
    cases = yaml.safe_load((ROOT / "tests" / "pipelines" / "bad_inputs.yaml").read_text(encoding="utf-8"))
    rows = [f"| {_cell(c['command'])} | {c['exit']} | {_cell(c['message'])} |" for c in cases]
    return "\n".join(["| input | exit | message |", "|---|---|---|", *rows])


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARK in markdown:
        markdown = markdown.replace(MARK, bad_input_table())
    if "<!-- README.md -->" in markdown:  # the front page is the README, its links made the site's
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        markdown = readme.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")
    if "<!-- CHANGELOG.md -->" in markdown:
        markdown = markdown.replace("<!-- CHANGELOG.md -->", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    return markdown
