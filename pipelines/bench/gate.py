"""The regression gate of ``asyncrlhf bench``: compare figures with a committed baseline.

The cases and suites live in :mod:`pipelines.bench.suite`. The baseline
(``pipelines/bench/baseline.json``, package data: an installed ``asyncrlhf bench`` has it)
holds, per suite, each figure's median and the environment it was measured on; a
figure worse than its tolerance (relative to the baseline, or absolute in the figure's
own unit) fails the gate, naming it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pipelines.bench.cases import Figure

__all__ = [
    "Comparison",
    "Figure",
    "compare",
    "comparison_table",
    "load_baseline",
    "packaged_baseline",
    "report_dict",
    "write_baseline",
]


def packaged_baseline() -> Path:
    """The committed baseline, wherever the package is (a clone, or site-packages)."""
    from importlib.resources import files

    return Path(str(files("pipelines.bench") / "baseline.json"))


@dataclass
class Comparison:
    figure: Figure
    baseline: float | None
    limit: float | None
    status: Literal["ok", "regressed", "new", "info"]

    @property
    def change(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        return self.figure.median / self.baseline - 1.0


def compare(figures: list[Figure], baseline: dict[str, Any], tolerance: float) -> list[Comparison]:
    """Compare figures with a baseline suite (``{name: {"median": ...}}``)."""
    out = []
    for figure in figures:
        base = baseline.get(figure.name)
        if base is None:
            out.append(Comparison(figure, None, None, "new"))
            continue
        value = float(base["median"])
        slack = figure.tolerance if figure.tolerance is not None else tolerance
        if figure.absolute:
            limit = value - slack if figure.better == "higher" else value + slack
        else:
            limit = value * (1 - slack) if figure.better == "higher" else value * (1 + slack)
        worse = figure.median < limit if figure.better == "higher" else figure.median > limit
        status = "info" if not figure.gate else ("regressed" if worse else "ok")
        out.append(Comparison(figure, value, limit, status))
    return out


def load_baseline(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"baseline {path} is not valid JSON: {err}") from err


def write_baseline(path: Path, suite: str, figures: list[Figure], env: dict[str, Any]) -> None:
    """Record ``figures`` for ``suite``; figures of cases not run this time are kept, and
    so is the environment they were measured on: a run of some cases records its own as
    ``<case>_environment`` (a figure's case is its name's first part)."""
    data = load_baseline(path)
    entry = data.setdefault("suites", {}).setdefault(suite, {"figures": {}})
    cases = {f.name.split(".")[0] for f in figures}
    if "environment" in entry and any(name.split(".")[0] not in cases for name in entry["figures"]):
        for case in sorted(cases):
            entry[f"{case}_environment"] = env
    else:  # every figure is this run's: one environment
        entry["environment"] = env
        for key in [k for k in entry if k.endswith("_environment")]:
            del entry[key]
    entry["figures"].update(
        {f.name: {"median": f.median, "min": f.min, "max": f.max, "better": f.better} for f in figures}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # never half-written


def report_dict(suite: str, comparisons: list[Comparison], env: dict[str, Any], baseline_env: Any) -> dict[str, Any]:
    return {
        "suite": suite,
        "environment": env,
        "baseline_environment": baseline_env,
        "regressions": [c.figure.name for c in comparisons if c.status == "regressed"],
        "figures": [
            {
                **asdict(c.figure),
                "baseline": c.baseline,
                "limit": c.limit,
                "status": c.status,
                "change": c.change,
                "target_met": c.figure.meets_target,
            }
            for c in comparisons
        ],
    }


def comparison_table(title: str, comparisons: list[Comparison]) -> Any:
    """The comparisons as a rich table: figure, spread, baseline, limit, status, target."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("figure", "median \\[min – max]", "baseline", "limit", "status", "target"):
        table.add_column(column)
    colours = {"ok": "green", "regressed": "bold red", "new": "yellow", "info": "dim"}
    for c in comparisons:
        f, bound = c.figure, "≥" if c.figure.better == "higher" else "≤"
        met = {None: "", True: " [green]met[/]", False: " [yellow]missed[/]"}[f.meets_target]
        table.add_row(
            f.name,
            f"{f.median:.3f} [{f.min:.3f} – {f.max:.3f}] {f.unit}",
            "—" if c.baseline is None else f"{c.baseline:.3f}",
            "—" if c.limit is None else f"{bound} {c.limit:.3f}",
            f"[{colours[c.status]}]{c.status}[/]",
            "" if f.target is None else f"{bound} {f.target:g}{met}",
        )
    return table
