"""Sweep specs: a base experiment, a search space over its dotted fields, how to search it.

``load_sweep(path)`` validates the sweep and its base experiment, trying every swept
field with one of its values, so a typo in a dotted path fails before any trial starts.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from pipelines.spec import TrackingSpec, spec_from_dict
from pipelines.spec.errors import format_validation_error
from pipelines.spec.files import SpecError, _Section, apply_overrides, read_yaml, set_path

__all__ = [
    "INFLIGHT_KEY",
    "STALENESS_KEYS",
    "PrunerSpec",
    "RangeSpec",
    "SweepRuntimeSpec",
    "SweepSpec",
    "TrialResourcesSpec",
    "choice_label",
    "choice_value",
    "load_sweep",
    "sweep_base",
]

# Fields that set a run's staleness: a sweep over one of them gets a staleness plot.
STALENESS_KEYS = ("orchestrator.lag", "buffer.max_staleness")
INFLIGHT_KEY = "orchestrator.inflight"  # swept: arms of whole sequences (null) and in-flight switches


class RangeSpec(_Section):
    """A numeric Optuna range: ``{low, high, log, step, type}``."""

    low: float = Field(description="Lower bound (inclusive).")
    high: float = Field(description="Upper bound (inclusive).")
    log: bool = Field(False, description="Sample on a log scale.")
    step: float | None = Field(None, gt=0, description="Quantisation step (not with log).")
    type: Literal["float", "int"] = Field("float", description="'int' for integer fields.")

    @model_validator(mode="after")
    def _check(self) -> RangeSpec:
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be below high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, got {self.low}")
        if self.log and self.step is not None:
            raise ValueError("step and log cannot be combined")
        return self

    def probe(self) -> float | int:
        """A value inside the range, to check the field accepts this type."""
        return int(self.low) if self.type == "int" else self.low


class PrunerSpec(_Section):
    kind: Literal["median", "none"] | None = Field(
        None, description="'median' (Optuna's MedianPruner) or 'none'; null: median for optuna, none for grid."
    )
    n_startup_trials: int = Field(2, ge=0, description="Trials that complete before any pruning.")
    n_warmup_steps: int = Field(0, ge=0, description="Steps of a trial before it may be pruned.")


class TrialResourcesSpec(_Section):
    num_cpus: float = Field(1.0, gt=0, description="CPUs one trial reserves on the cluster.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs one trial reserves.")


class SweepRuntimeSpec(_Section):
    address: str | None = Field(
        None, description="Ray cluster to run trials on ('auto', 'ray://head:10001'); null: a local cluster."
    )
    num_cpus: int = Field(2, ge=1, description="CPUs of the local cluster started when address is null.")


class SweepSpec(_Section):
    """Many experiments: a base experiment, a search space over its dotted fields, and
    how to search it (the full grid, or an Optuna study)."""

    name: str = Field(
        min_length=1,
        max_length=250,
        pattern=r"^[^/\\]+$",
        description="Sweep name: the MLflow parent run and the Optuna study (no '/' or '\\': it names files too).",
    )
    description: str = Field("", description="What the sweep is for.")
    base: str | dict[str, Any] = Field(
        description="Base experiment: a YAML path (relative to the sweep file) or an inline mapping."
    )
    overrides: list[str] = Field(default_factory=list, description="Dotted key=value overrides of the base.")
    method: Literal["grid", "optuna"] = Field("grid", description="'grid': every combination; 'optuna': TPE.")
    space: dict[str, list[Any] | RangeSpec] = Field(
        min_length=1, description="Dotted experiment field → list of values, or an Optuna range (optuna only)."
    )
    objective: str = Field("eval/accuracy", min_length=1, description="Metric to optimise (its last value).")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="Optimisation direction.")
    trials: int | None = Field(None, ge=1, description="Number of trials (grid: default the whole grid).")
    parallel: int = Field(2, ge=1, description="Trials running at the same time.")
    seed: int = Field(0, ge=0, description="Seeds the Optuna sampler.")
    seeds: list[int] | None = Field(
        None,
        description="Run every configuration once per seed (the experiment's `seed`: sampling and data order, "
        "not the start checkpoint); its value is the seed mean, summaries give mean, std, 95% CI and n. "
        "null: one run at the base's seed.",
    )
    pruner: PrunerSpec = Field(default_factory=PrunerSpec, description="optuna: early stopping of poor trials.")
    storage: str | None = Field(None, description="Optuna storage URL; null: sqlite:///mlflow/optuna.db.")
    trial_resources: TrialResourcesSpec = Field(
        default_factory=TrialResourcesSpec, description="Cluster resources of one trial."
    )
    runtime: SweepRuntimeSpec = Field(default_factory=SweepRuntimeSpec, description="Where the trials run.")
    tracking: TrackingSpec = Field(
        default_factory=lambda: TrackingSpec(experiment="sweeps"), description="MLflow (parent and child runs)."
    )

    quick: list[str] = Field(
        default_factory=list,
        description="Overrides of this sweep file applied by `asyncrlhf sweep --quick` (a smaller, faster variant).",
    )

    @field_validator("space")
    @classmethod
    def _values(cls, space: dict[str, Any]) -> dict[str, Any]:
        for key, values in space.items():
            if isinstance(values, list) and not values:
                raise ValueError(f"{key}: empty list of values")
            if isinstance(values, list) and any(isinstance(v, dict) for v in values):
                if not all(isinstance(v, dict) or v is None for v in values):  # null: the section left out
                    raise ValueError(f"{key}: mix of mappings and plain values")
                labels = [choice_label(v) for v in values]
                repeated = sorted({label for label in labels if labels.count(label) > 1})
                if repeated:
                    raise ValueError(f"{key}: two choices labelled {repeated}: give each a distinct 'label'")
        return space

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is None:
            return None
        if not seeds:
            raise ValueError("empty list: give at least one seed, or leave seeds out")
        negative = [s for s in seeds if s < 0]
        if negative:
            raise ValueError(f"every seed must be ≥ 0: {negative} are not")
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"duplicate seeds {repeated}: each seed runs once per configuration")
        return seeds

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.seeds is not None and "seed" in self.space:
            raise ValueError("space.seed and seeds both vary the seed: keep one (seeds: [...] gives mean ± CI)")
        if self.method == "grid":
            ranges = [key for key, values in self.space.items() if not isinstance(values, list)]
            if ranges:
                raise ValueError(f"grid sweeps need lists of values; {ranges} are ranges (use method 'optuna')")
            if self.trials is not None and self.trials > self.grid_size:
                raise ValueError(f"trials={self.trials} exceeds the grid's {self.grid_size} combinations")
        elif self.trials is None:
            raise ValueError("optuna sweeps need trials")
        if self.runtime.address is None and self.trial_resources.num_cpus > self.runtime.num_cpus:
            raise ValueError(
                f"trial_resources.num_cpus={self.trial_resources.num_cpus:g} exceeds the local cluster's "
                f"runtime.num_cpus={self.runtime.num_cpus}: no trial could start"
            )
        return self

    @property
    def grid_size(self) -> int:
        size = 1
        for values in self.space.values():
            size *= len(values) if isinstance(values, list) else 0
        return size

    @property
    def num_trials(self) -> int:
        return self.trials if self.trials is not None else self.grid_size

    @property
    def prunes(self) -> bool:
        kind = self.pruner.kind or ("median" if self.method == "optuna" else "none")
        return kind == "median"

    @property
    def study_name(self) -> str:
        return self.name


def choice_label(value: Any) -> str:
    """A swept value as Optuna and MLflow see it: itself, or for a whole section given as
    a mapping, its ``label`` (default: its values joined with ``/``); null beside
    mappings (the section left out) is ``"none"``."""
    if value is None:
        return "none"
    if not isinstance(value, dict):
        return value
    return str(value.get("label") or "/".join(str(v) for v in value.values()))


def choice_value(values: list[Any] | Any, label: Any) -> Any:
    """What a suggested ``label`` sets: the mapping it labels (without ``label``), or itself."""
    if isinstance(values, list):
        for value in values:
            if isinstance(value, dict) and choice_label(value) == label:
                return {k: v for k, v in value.items() if k != "label"}
        if label == "none" and None in values:
            return None
    return label


def load_sweep(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), quick: bool = False
) -> tuple[SweepSpec, dict[str, Any]]:
    """Read and validate a sweep file; returns the sweep and its base experiment as a
    mapping (base file + the sweep's overrides), checked against the search space.
    ``quick`` applies the file's own ``quick`` overrides first.

    Every swept field is tried with one of its values so a typo in a dotted path fails
    here, naming the key, before any trial starts.
    """
    path = Path(path)
    data = read_yaml(path)
    if quick:
        if not data.get("quick"):
            raise SpecError(f"{path}: --quick, but the sweep has no 'quick' overrides")
        data = _override(data, data["quick"])
    data = _override(data, overrides)
    try:
        sweep = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{path}: {format_validation_error(err, data)}") from None
    return sweep, sweep_base(sweep, path.parent)


def _override(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """A key of the sweep (name, seeds, space…) changes the sweep; any other is one more
    override of its base experiment (``trainer.steps=20``), after the sweep's own."""
    own = [o for o in overrides if o.partition("=")[0].split(".")[0] in SweepSpec.model_fields]
    data = apply_overrides(data, own)
    rest = [o for o in overrides if o not in own]
    if rest and isinstance(data.get("overrides", []), list):
        data["overrides"] = [*data.get("overrides", []), *rest]
    return data


def sweep_base(sweep: SweepSpec, folder: Path = Path(".")) -> dict[str, Any]:
    """The base experiment mapping of ``sweep`` (paths relative to ``folder``), validated
    with every swept field."""
    if isinstance(sweep.base, dict):
        base, source = copy.deepcopy(sweep.base), f"{sweep.name}: base"
    else:
        candidate = folder / sweep.base
        base_path = candidate if candidate.is_file() else Path(sweep.base)
        base, source = read_yaml(base_path), str(base_path)
    base = apply_overrides(base, sweep.overrides)
    spec = spec_from_dict(copy.deepcopy(base), source=source)
    if spec.runtime.kind != "local":
        raise SpecError(f"{source}: runtime.kind={spec.runtime.kind!r}: each sweep trial runs as one Ray task, locally")
    for key, values in sweep.space.items():
        if isinstance(values, RangeSpec) and values.type == "float" and _integer_field(base, key, values):
            values.type = "int"  # a float range over an integer field samples integers
        probe = choice_value(values, choice_label(values[0])) if isinstance(values, list) else values.probe()
        try:
            spec_from_dict(set_path(copy.deepcopy(base), key, probe), source=source)
        except SpecError as err:
            raise SpecError(f"space.{key}={probe!r}: {err}") from None
    return base


def _integer_field(base: dict[str, Any], key: str, values: RangeSpec) -> bool:
    """Whether ``key`` takes integers: it accepts a whole number from the range and
    refuses one with a fraction."""

    def accepts(value: float) -> bool:
        try:
            spec_from_dict(set_path(copy.deepcopy(base), key, value))
        except SpecError:
            return False
        return True

    whole = float(int(values.low)) if int(values.low) >= values.low else float(int(values.low) + 1)
    return whole <= values.high and accepts(int(whole)) and not accepts(whole + 0.5)
