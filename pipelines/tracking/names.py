"""What a run is called and coloured in MLflow: names that lead with what differs and fit
the runs table, one colour per configuration (its seeds share it), and links that open
MLflow's Model-training layout."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "COLOR_TAG",
    "CONFIG_TAG",
    "GROUPED_VIEW_KEY",
    "PALETTE",
    "VIEW_KEY",
    "choose_color",
    "config_key",
    "experiment_runs",
    "experiment_url",
    "format_value",
    "git_commit",
    "run_name_for",
    "run_tags",
    "run_url",
    "save_view",
]

NAME_LIMIT = 40  # characters of a run name the saved view's Run Name column shows whole
NAME_COLUMN_PX = 330  # MLflow's default is 190 px, about 22 characters
RUN_NAME = "attributes.`Run Name`"  # the runs table's column id
COLOR_TAG = "mlflow.runColor"  # the tag MLflow's UI reads (and writes) a run's chart colour from
CONFIG_TAG = "asyncrlhf.config"  # what makes two runs the same configuration (seeds aside)
# Twelve hues far apart, dark enough on white: a run's colour in every chart and legend.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
PALETTE += ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939")
# How a changed knob's key is shown: its last part, or these shorter words.
ALIASES = {"max_staleness": "staleness", "batch_size": "batch", "group_size": "group", "max_new_tokens": "new_tokens"}
# Knobs that say how long, how big or how often, not what is run: named last, while they fit.
CADENCE = ("trainer.steps", "trainer.batch_size", "orchestrator.eval_every", "task.eval_size", "trainer.checkpoint_")
CADENCE += ("runtime.",)
UNNAMED = ("tracking.", "name", "description", "seed")  # bookkeeping (the seed is named by ·sN)
MODEL_TRAINING = "workflowType=machine_learning"  # MLflow 3 otherwise opens its GenAI layout
CHANGED_TAG = "asyncrlhf.changed"  # the knobs a run changed from its base spec (a JSON list)
VIEW_KEY = "asyncrlhf"  # the experiment's saved view: tag mlflow.sharedViewState.<key>, link ?viewStateShareKey=
GROUPED_VIEW_KEY = "asyncrlhf-by-config"  # a sweep's: its trials grouped by tag sweep.config
CONFIG_GROUP = {"mode": "tag", "groupByData": "sweep.config"}


def format_value(value: Any) -> str:
    """A knob's value, short: ``0.0001`` → ``1e-4``, ``3e-05`` → ``3e-5``, ``True`` → ``true``.

    >>> [format_value(v) for v in (0.0001, "3e-05", 0.5, 64, "m2po", True, "False", 2.5e-4)]
    ['1e-4', '3e-5', '0.5', '64', 'm2po', 'true', 'false', '2.5e-4']
    """
    if isinstance(value, bool) or value in ("True", "False"):  # a bool, or one flattened
        return str(value).lower()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)[:24]
    if number.is_integer() and abs(number) < 1e6:
        return str(int(number))
    if 0 < abs(number) < 1e-2:
        mantissa, exponent = f"{number:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{number:.4g}"


def run_name_for(name: str, changes: dict[str, Any], seed: int | None = None, limit: int | None = NAME_LIMIT) -> str:
    """A run name that leads with what differs from the base spec and fits the runs table.

    The changed knobs come first (an algorithm or a kind by its value alone), then the
    seed; how long, how big and how often (steps, batch, eval cadence) come last and only
    while the name stays within ``limit`` characters (all of them with ``limit=None``: a
    sweep's trials name every swept value). With no knob changed, the base name leads.

    >>> run_name_for("quickstart", {"trainer.steps": 40, "trainer.lr": 1e-4, "orchestrator.lag": 4})
    'lr=1e-4·lag=4·steps=40'
    >>> run_name_for("sweep-003", {"orchestrator.lag": 16, "algorithm.name": "m2po"}, seed=0)
    'lag=16·m2po·s0'
    >>> run_name_for("quickstart", {"trainer.steps": 40})
    'quickstart·steps=40'
    """
    named = {k: v for k, v in changes.items() if not k.startswith(UNNAMED)}
    knobs = {k: v for k, v in named.items() if not k.startswith(CADENCE)}
    cadence = {k: v for k, v in named.items() if k.startswith(CADENCE)}
    labels = _labels(list(named))
    parts = [_part(labels[k], k, v) for k, v in knobs.items()] or [name]
    seed = changes.get("seed") if seed is None else seed
    if seed is not None:
        parts.append(f"s{seed}")
    for key, value in cadence.items():
        part = _part(labels[key], key, value)
        if limit is not None and len("·".join([*parts, part])) > limit:
            break
        parts.append(part)
    return "·".join(parts)


def _labels(keys: list[str]) -> dict[str, str]:
    """Each key's shown label: its alias or last part, or its last two parts where two
    keys would otherwise read alike."""

    def short(key: str) -> str:
        parts = key.split(".")
        tail = parts[-2] if len(parts) > 1 and parts[-1] in ("name", "kind") else parts[-1]
        return ALIASES.get(tail, tail)

    shorts = [short(k) for k in keys]
    return {k: s if shorts.count(s) == 1 else ".".join(k.split(".")[-2:]) for k, s in zip(keys, shorts, strict=True)}


def _part(label: str, key: str, value: Any) -> str:
    if key.endswith((".name", ".kind")) and isinstance(value, str):
        return value[:24]  # m2po, lagged, jsonl: the value says what it is
    return f"{label}={format_value(value)}"


def config_key(values: dict[str, str]) -> str:
    """A short hash of a run's flattened knobs but its seed: the runs of one configuration
    share it, whatever seed each ran."""
    kept = {k: v for k, v in values.items() if k != "seed"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def experiment_runs(client: Any, experiment_id: str) -> list[Any]:
    """The experiment's runs, newest first (what colours and views are chosen from)."""
    return client.search_runs([experiment_id], max_results=1000)


def choose_color(runs: list[Any], key: str) -> str:
    """The colour of configuration ``key`` among its experiment's ``runs``: that of an
    earlier run of the same configuration, else the first colour of :data:`PALETTE` no
    other configuration there has (round the palette again once all are taken)."""
    taken: list[str] = []
    for run in runs:
        color = run.data.tags.get(COLOR_TAG)
        if color and run.data.tags.get(CONFIG_TAG) == key:
            return color
        if color:
            taken.append(color)
    free = [c for c in PALETTE if c not in taken]
    return free[0] if free else PALETTE[len({run.data.tags.get(CONFIG_TAG) for run in runs}) % len(PALETTE)]


def experiment_url(base: str, experiment_id: str, view: str | None = None) -> str:
    """The experiment's runs table in the Model-training layout (with a saved view)."""
    query = MODEL_TRAINING + (f"&viewStateShareKey={view}" if view else "")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the Model-training layout."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING}"


def git_commit(folder: str | Path | None = None) -> str | None:
    """The commit of the checkout at ``folder`` (default: the working directory), or None
    outside git; MLflow's Source column links it."""
    try:
        command = ["git", "rev-parse", "HEAD"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=5, check=True, cwd=folder)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_tags(runs: list[Any], values: dict[str, str], tags: dict[str, str]) -> dict[str, str]:
    """The tags that place a new run among its experiment's ``runs``: its configuration
    and colour, the knobs it changed (from its ``tags``: as the CLI names them, or a sweep
    trial's swept values), and its source (the command and the git commit)."""
    key = config_key(values)
    changed = _changed(tags)
    tags = {
        CONFIG_TAG: key,
        COLOR_TAG: choose_color(runs, key),
        CHANGED_TAG: json.dumps(changed),
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "asyncrlhf",
    }
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def save_view(
    client: Any,
    experiment_id: str,
    objective: str = "eval/accuracy",
    maximize: bool = True,
    extra: Sequence[str] = (),
    runs: list[Any] | None = None,
) -> None:
    """Save the experiment's default view (opened by :func:`experiment_url` with
    :data:`VIEW_KEY`): the objective, ``eval/accuracy`` and ``reward/mean``, and every knob
    one of its runs changed (those of :data:`CADENCE` last, ``runtime.*`` left out), as
    columns, then the metrics ``extra`` (a sweep's per-configuration summary); sorted by the
    objective, best first. With ``extra``, also :data:`GROUPED_VIEW_KEY`: the same, its
    trials grouped by configuration. ``runs``: the experiment's, where the caller has them."""
    changed: dict[str, None] = {}
    for run in reversed(experiment_runs(client, experiment_id) if runs is None else runs):  # oldest first
        changed.update(dict.fromkeys(k for k in _changed(run.data.tags) if not k.startswith(UNNAMED)))
    keys = [k for k in changed if not k.startswith(CADENCE)] + [k for k in changed if k.startswith(CADENCE[:-1])]
    metrics = list(dict.fromkeys([objective, "eval/accuracy", "reward/mean", *extra]))
    columns = [*(f"metrics.`{m}`" for m in metrics), *(f"params.`{k}`" for k in keys)]
    state = {
        "orderByKey": f"metrics.`{objective}`",
        "orderByAsc": not maximize,
        "selectedColumns": columns,
        # MLflow sizes only the columns it is given an order for: a 40-character name, whole
        "columnOrder": [RUN_NAME, "runDateAndNestInfo", "duration", *columns],
        "columnWidths": {RUN_NAME: NAME_COLUMN_PX, **{f"metrics.`{m}`": 180 for m in extra}},
    }
    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(state))
    if extra:  # a sweep: the same view with its trials grouped by configuration (mean ± range)
        grouped = {**state, "groupBy": {"aggregateFunction": "average", "groupByKeys": [CONFIG_GROUP]}}
        client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{GROUPED_VIEW_KEY}", json.dumps(grouped))


def _changed(tags: dict[str, str]) -> list[str]:
    return json.loads(tags.get(CHANGED_TAG) or "[]") or list(json.loads(tags.get("sweep.params") or "{}"))
