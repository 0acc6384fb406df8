"""A sweep's one report, built from ``study.trials_dataframe()``: rows, tables, plots.

A row is one counted trial (a configuration): its value is the seed mean, with the
standard deviation, the 95% confidence interval and n beside it. The CLI's table, and
``trials.md``, ``trials.csv``, ``trials.json`` and the plots logged on the parent run,
are all written from :class:`SweepReport`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.sweeps.spec import INFLIGHT_KEY, STALENESS_KEYS, SweepSpec
from pipelines.sweeps.stats import SeedSummary, summarize
from pipelines.sweeps.study import INTERRUPTED
from pipelines.tracking.plots import plot_objective, plot_staleness

__all__ = ["SweepReport", "arm_label", "format_value", "staleness_axes", "staleness_table", "trial_rows"]

_ATTRS = ("number", "value", "datetime_start", "datetime_complete", "params", "user_attrs", "state")
_COUNTED = ("COMPLETE", "PRUNED", "FAIL")


def _missing(value: Any) -> bool:
    """None, NaN or NaT: what the dataframe puts where a trial has nothing."""
    return value is None or (not isinstance(value, dict | list) and value != value)


def _typed(sweep: SweepSpec, key: str, value: Any) -> Any:
    """A parameter as the space gave it (the dataframe turns ints into floats)."""
    values = sweep.space[key]
    if isinstance(values, list):
        return next((choice for choice in values if choice == value), value)
    return int(value) if values.type == "int" else value


def _row(sweep: SweepSpec, record: dict[str, Any]) -> dict[str, Any]:
    attrs = {k.removeprefix("user_attrs_"): v for k, v in record.items() if k.startswith("user_attrs_")}
    attrs = {k: v for k, v in attrs.items() if not _missing(v)}
    value = None if _missing(record["value"]) else float(record["value"])
    seeds = {int(seed): v for seed, v in attrs.get("seed_values", {}).items()}
    spread = summarize(list(seeds.values())) if seeds and value is not None else None
    start, end = record["datetime_start"], record["datetime_complete"]
    duration = None if _missing(start) or _missing(end) else (end - start).total_seconds()
    run_ids = dict(attrs.get("mlflow_run_ids", {}))
    given = {k: record.get(f"params_{k}") for k in sweep.space}
    params = {k: _typed(sweep, k, v) for k, v in given.items() if not _missing(v)}
    return {
        "number": int(record["number"]),
        "state": record["state"],
        "value": value,
        "std": spread.std if spread else None,
        "ci95": spread.ci95 if spread and spread.n > 1 else None,
        "n": spread.n if spread else 0,
        "seed_values": seeds,
        "params": params,
        "last_step": attrs.get("last_step"),
        "duration_s": duration,
        "run_id": next(iter(run_ids.values()), None),
        "run_ids": run_ids,
        "error": attrs.get("error"),
        "token_staleness": attrs.get("token_staleness"),
    }


def trial_rows(study: Any, sweep: SweepSpec) -> list[dict[str, Any]]:
    """Counted trials, best first by the objective (trials without a value last)."""
    frame = study.trials_dataframe(attrs=_ATTRS)
    cut = set(study.user_attrs.get(INTERRUPTED, []))
    records = [r for r in frame.to_dict("records") if r["state"] in _COUNTED and int(r["number"]) not in cut]
    rows = [_row(sweep, record) for record in records]
    sign = -1.0 if sweep.direction == "maximize" else 1.0
    return sorted(rows, key=lambda r: (r["value"] is None, sign * (r["value"] or 0.0), r["number"]))


def format_value(row: dict[str, Any]) -> str:
    """``mean ± ci95 (n=3)`` for seeded rows, the plain value otherwise, '' for none."""
    if row["value"] is None:
        return ""
    if row["ci95"] is None:
        return f"{row['value']:.4f}"
    return f"{row['value']:.4f} ± {row['ci95']:.4f} (n={row['n']})"


def staleness_axes(sweep: SweepSpec) -> tuple[str, str | None] | None:
    """(staleness key, algorithm key or None) when the sweep varies staleness."""
    key = next((k for k in STALENESS_KEYS if k in sweep.space), None)
    if key is None:
        return None
    algo = next((k for k in ("algorithm.name", "algorithm") if k in sweep.space), None)  # a name, or whole sections
    return key, algo


def arm_label(sweep: SweepSpec, params: dict[str, Any]) -> str:
    """What a staleness sweep draws as one line: the algorithm's label (the objective's
    name when only staleness varies), with the in-flight arm when that is swept too."""
    axes = staleness_axes(sweep)
    algo_key = axes[1] if axes else None
    label = str(params.get(algo_key, "")) if algo_key else sweep.objective
    return f"{label} · {params.get(INFLIGHT_KEY, 'none')}" if INFLIGHT_KEY in sweep.space else label


def staleness_table(sweep: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, dict[Any, SeedSummary]]:
    """Objective of complete trials per algorithm and staleness value, summarised over
    every seed of every matching trial (mean, std, 95% CI, n).

    With in-flight arms swept (``orchestrator.inflight``: null for whole sequences, a
    mapping of ``switch_at`` for the exact variant), one line per algorithm and arm, each
    cell at its trials' measured mean per-token staleness (``staleness/token_mean`` over
    the run, seed mean, in versions), so in-flight and whole-sequence data sit on one axis."""
    axes = staleness_axes(sweep)
    assert axes is not None, "not a staleness sweep"
    key = axes[0]
    arms = INFLIGHT_KEY in sweep.space
    cells: dict[str, dict[Any, list[float]]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            algo, x = arm_label(sweep, r["params"]), r["params"][key]
            if arms and r.get("token_staleness") is not None:
                x = round(float(r["token_staleness"]), 2)
            values = list(r["seed_values"].values()) or [r["value"]]
            cells.setdefault(algo, {}).setdefault(x, []).extend(values)
    return {a: {k: summarize(v) for k, v in sorted(by_k.items())} for a, by_k in cells.items()}


@dataclass
class SweepReport:
    """The rows of a sweep and every view of them."""

    sweep: SweepSpec
    rows: list[dict[str, Any]]

    @property
    def objective_label(self) -> str:
        return f"{self.sweep.objective} (mean ± 95% CI)" if self.sweep.seeds else self.sweep.objective

    def records(self) -> list[dict[str, Any]]:
        """Flat records (rank, trial, state, objective, spread, params…): CSV and JSON."""
        out = []
        for rank, r in enumerate(self.rows, 1):
            record = {
                "rank": rank,
                "trial": r["number"],
                "state": r["state"],
                self.sweep.objective: r["value"],
                "std": r["std"],
                "ci95": r["ci95"],
                "n": r["n"],
            }
            record.update({key: r["params"].get(key) for key in self.sweep.space})
            record.update(
                {
                    "seed_values": r["seed_values"],
                    "last_step": r["last_step"],
                    "duration_s": r["duration_s"],
                    "token_staleness": r["token_staleness"],  # seed mean of the run's staleness/token_mean
                    "run_ids": r["run_ids"],
                    "error": r["error"],
                }
            )
            out.append(record)
        return out

    def display(self) -> tuple[list[str], list[list[str]]]:
        """Header and string cells for people: the CLI's table and ``trials.md``."""
        seeded, arms = bool(self.sweep.seeds), INFLIGHT_KEY in self.sweep.space
        head = [
            "rank",
            "trial",
            "state",
            self.objective_label,
            *(["std", "per seed"] if seeded else []),
            *self.sweep.space,
            *(["token staleness"] if arms else []),
            "steps",
            "time (s)",
        ]
        cells = []
        for rank, r in enumerate(self.rows, 1):
            spread = []
            if seeded:
                per_seed = ", ".join(f"{seed}: {value:.3f}" for seed, value in sorted(r["seed_values"].items()))
                spread = ["" if r["std"] is None else f"{r['std']:.4f}", per_seed]
            params = [_short(r["params"].get(k, "")) for k in self.sweep.space]
            if arms:  # the measured mean per-token staleness the plot draws the trial at
                params.append("" if r["token_staleness"] is None else f"{r['token_staleness']:.2f}")
            steps = "" if r["last_step"] is None else str(r["last_step"])
            duration = "" if r["duration_s"] is None else f"{r['duration_s']:.0f}"
            cells.append([str(rank), str(r["number"]), r["state"], format_value(r), *spread, *params, steps, duration])
        return head, cells

    def markdown(self) -> str:
        sweep, (head, cells) = self.sweep, self.display()
        seeds = f" × seeds {sweep.seeds}" if sweep.seeds else ""
        lines = [
            f"# {sweep.name}: {len(self.rows)} trials{seeds}, {sweep.direction} {sweep.objective}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> list[Path]:
        """``trials.csv``, ``trials.md``, ``trials.json`` and the plots, into ``folder``."""
        records = self.records()
        with open(folder / "trials.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(records[0]) if records else ["rank"])
            writer.writeheader()
            writer.writerows({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()} for r in records)
        (folder / "trials.md").write_text(self.markdown())
        (folder / "trials.json").write_text(json.dumps(records, indent=1, default=str))
        self._plots(folder)
        return sorted(folder.iterdir())

    def _plots(self, folder: Path) -> None:
        sweep = self.sweep
        ranges = {k: v.log for k, v in sweep.space.items() if not isinstance(v, list)}
        done = [r for r in self.rows if r["state"] == "COMPLETE"]
        title = f"{sweep.name}: {sweep.objective} per configuration"
        if sweep.seeds:
            title += f" (mean ± 95% CI over {len(sweep.seeds)} seeds)"
        plot_objective(done, list(sweep.space), sweep.objective, ranges, title, folder / "objective_vs_params.png")
        axes = staleness_axes(sweep)
        if axes:
            title = f"{sweep.name}: {sweep.objective} vs staleness"
            table = staleness_table(sweep, self.rows)
            x = "mean per-token, staleness/token_mean" if INFLIGHT_KEY in sweep.space else axes[0]
            plot_staleness(table, x, sweep.objective, title, folder / "objective_vs_staleness.png")


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
