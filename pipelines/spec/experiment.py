"""Experiment specs: one pydantic model per section, every field described.

An experiment is a YAML file validated into :class:`ExperimentSpec`. Unknown keys fail at
once (``extra="forbid"``), cross-field rules live in model validators, and a default
lives here and nowhere else (a loss's options default to the loss's own signature).
``load_spec(path, ["trainer.lr=1e-4"])`` applies dotted overrides before validation
(:mod:`pipelines.spec.files`), so they are typed by the schema like the file itself.
Sections map onto the core's config objects: ``spec.to_schedule()`` is the run's
:class:`~asyncrlhf.orchestration.Schedule`, ``spec.algorithm`` names a registered loss
and its options. Sweeps have their own schema (:mod:`pipelines.sweeps.spec`).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from asyncrlhf.advantages import get_advantage
from asyncrlhf.orchestration.schedule import Schedule
from pipelines.spec.algorithms import AlgorithmSection, schema_union, validate_algorithm
from pipelines.spec.errors import format_validation_error
from pipelines.spec.files import SpecError, _Section, apply_overrides, read_yaml
from pipelines.spec.model import ModelSpec
from pipelines.spec.plugins import import_plugins
from pipelines.spec.sections import (
    ActorSpec,
    BufferSpec,
    OrchestratorSpec,
    RewardTermSpec,
    RolloutSpec,
    RuntimeSpec,
    TrackingSpec,
    TrainerSpec,
)
from pipelines.spec.tasks import TaskSpec
from pipelines.spec.trust import (
    code_in_spec,
    code_trusted,
    importing,
    names_unchecked,
    note_unchecked,
    refusal,
    skip_plugins,
)

__all__ = [
    "ActorSpec",
    "BufferSpec",
    "ExperimentSpec",
    "ModelSpec",
    "OrchestratorSpec",
    "RewardTermSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "SpecError",
    "TaskSpec",
    "TrackingSpec",
    "TrainerSpec",
    "format_validation_error",
    "load_spec",
    "spec_from_dict",
]


class ExperimentSpec(_Section):
    """A whole experiment: what to train, how, and where the results go."""

    name: str = Field(
        "experiment", min_length=1, max_length=250, description="Short name; the default MLflow run name."
    )
    description: str = Field("", description="What this experiment is for.")
    plugins: list[str] = Field(
        default_factory=list,
        description="Modules or .py files imported before the rest of the spec is read: where your own policy "
        "losses, advantage estimators and reward terms register (see docs/extending.md).",
    )
    seed: int = Field(0, ge=0, description="Seeds the task, the engine, the trainer and torch.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="The policy.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="The verifiable task.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Sampling.")
    rewards: list[RewardTermSpec] = Field(
        default_factory=lambda: [RewardTermSpec(kind="exact_match")],
        min_length=1,
        description="Reward terms, summed with their weights.",
    )
    algorithm: SerializeAsAny[AlgorithmSection] = Field(
        default_factory=lambda: validate_algorithm({}),
        description="The policy loss and its options, by `name` (default 'grpo'), and the advantage estimator.",
    )
    buffer: BufferSpec = Field(default_factory=BufferSpec, description="The replay buffer.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="Optimisation.")
    orchestrator: OrchestratorSpec = Field(default_factory=OrchestratorSpec, description="Rollout/training interplay.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="Where it runs.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="MLflow.")

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        """Code the spec names is refused unless trusted; imported (plugins first, so
        what they register is known) unless validating without imports."""
        found = code_in_spec(data)
        if not importing():
            for item in found:
                note_unchecked(f"would import {item}")
            skip_plugins(data.get("plugins") if isinstance(data, dict) else None)
            return data
        if found and not code_trusted():
            raise ValueError(refusal(found))
        if isinstance(data, dict) and data.get("plugins"):
            import_plugins(data["plugins"])
        return data

    @field_validator("algorithm", mode="wrap", json_schema_input_type=schema_union())
    @classmethod
    def _algorithm(cls, value: Any, handler: Any) -> AlgorithmSection:
        """Validated by the model of the loss it names (registered when the spec is read)."""
        return validate_algorithm(value)

    @model_validator(mode="after")
    def _cross_field(self) -> ExperimentSpec:
        group = self.rollout.group_size
        needs = _min_group_size(self.algorithm.advantage)
        if group < needs:
            raise ValueError(
                f"algorithm.advantage {self.algorithm.advantage!r} needs rollout.group_size >= {needs} (got {group})"
            )
        if self.trainer.batch_size % group:
            raise ValueError(
                f"trainer.batch_size={self.trainer.batch_size} is not a multiple of rollout.group_size={group}"
            )
        if self.trainer.mini_batches > self.trainer.batch_size:
            raise ValueError(
                f"trainer.mini_batches={self.trainer.mini_batches} exceeds trainer.batch_size={self.trainer.batch_size}"
            )
        trainer = self.trainer
        if trainer.lr_decay != "constant" and trainer.warmup >= trainer.total_updates:
            raise ValueError(
                f"trainer.warmup_updates={trainer.warmup_updates} leaves no update to decay over with "
                f"lr_decay '{trainer.lr_decay}' (the run makes {trainer.total_updates})"
            )
        orch = self.orchestrator
        if orch.mode == "lagged" and orch.lag is None:
            raise ValueError("orchestrator.lag is required in mode 'lagged'")
        longest = Schedule.max_publish_every(self.buffer.max_staleness)
        if orch.mode == "async" and orch.publish_every > longest:
            raise ValueError(
                f"orchestrator.publish_every={orch.publish_every} > buffer.max_staleness + 1 = {longest}: "
                "the rollout worker could never get fresh enough weights"
            )
        if orch.inflight is not None:
            self._check_inflight()
        _check_runtime(self.runtime, self.rollout.workers)
        if self.model.dtype == "float64" and self.rollout.engine == "vllm":
            raise ValueError("model.dtype 'float64' needs rollout.engine 'hf': vLLM has no float64 kernels")
        if self.rollout.engine == "vllm" and self.runtime.address is None and find_spec("vllm") is None:
            from asyncrlhf.rollout.vllm import INSTALL_VLLM  # a module without vllm's import

            raise ValueError(INSTALL_VLLM)
        if self.rollout.vllm and self.rollout.engine != "vllm":
            raise ValueError(
                f"rollout.vllm (engine arguments) needs rollout.engine 'vllm', not {self.rollout.engine!r}"
            )
        return self

    def _check_inflight(self) -> None:
        if self.rollout.engine == "vllm" and self.orchestrator.inflight.switch_at:  # type: ignore[union-attr]
            raise ValueError(
                "orchestrator.inflight.switch_at (the exact variant) needs rollout.engine 'hf': vLLM schedules each "
                "request's prefill and decode steps itself, so a switch cannot land on a fixed response position"
            )
        if self.runtime.kind != "local":
            raise ValueError(
                f"orchestrator.inflight needs runtime.kind 'local' (the Ray runtime loads weights between "
                f"batches), not {self.runtime.kind!r}"
            )
        mode, switch_at = self.orchestrator.mode, self.orchestrator.inflight.switch_at  # type: ignore[union-attr]
        if mode == "sync":
            raise ValueError(
                "orchestrator.inflight needs orchestrator.mode 'async' or 'lagged', not 'sync' (which generates "
                "each batch with the one version it trains)"
            )
        if mode == "lagged" and not switch_at:
            raise ValueError(
                "orchestrator.inflight.switch_at is required in mode 'lagged' (the exact variant: the response "
                "positions where a batch moves to the next version)"
            )
        try:
            self.to_schedule()
        except ValueError as err:  # the schedule's own checks, on switch_at
            raise ValueError(f"orchestrator.inflight.{err}") from None

    @property
    def prompts_per_step(self) -> int:
        return self.trainer.batch_size // self.rollout.group_size

    def to_schedule(self) -> Any:
        """The core's :class:`~asyncrlhf.orchestration.Schedule` of this experiment."""
        orch = self.orchestrator
        return Schedule(
            orch.mode,
            self.rollout.group_size,
            self.prompts_per_step,
            self.buffer.max_staleness,
            orch.publish_every,
            orch.lag or 0,
            orch.eval_every,
            inflight=orch.inflight is not None,
            switch_at=tuple(orch.inflight.switch_at) if orch.inflight else (),
            recompute_kv=orch.inflight is not None and orch.inflight.kv == "recompute",
            chunk_tokens=orch.inflight.chunk_tokens if orch.inflight else 8,
        )


# ---------------------------------------------------------------------------- loading
def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentSpec:
    """Read a YAML experiment, apply dotted overrides, validate.

    Raises:
        SpecError: one message naming every bad field and its value.
    """
    path = Path(path)
    return spec_from_dict(apply_overrides(read_yaml(path), overrides), source=str(path))


def spec_from_dict(data: dict[str, Any], source: str = "spec") -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{source}: {format_validation_error(err, data)}") from None


def _min_group_size(advantage: str) -> int:
    """The estimator's smallest group (1 for one validation left unchecked: a name a
    plugin not imported may register)."""
    try:
        return get_advantage(advantage).min_group_size
    except ValueError:
        if not names_unchecked():
            raise
        return 1


def _check_runtime(runtime: Any, workers: int) -> None:
    """What the runtime can run: more than one worker or rank needs Ray; a local cluster
    (one node, runtime.num_cpus) must hold every actor."""
    ranks = runtime.trainer.ranks
    if runtime.kind == "local" and workers > 1:
        raise ValueError(f"rollout.workers={workers} needs runtime.kind 'ray' (the local runtime runs one)")
    if runtime.kind == "local" and ranks > 1:
        raise ValueError(f"runtime.trainer.ranks={ranks} needs runtime.kind 'ray' (the local runtime trains in one)")
    if runtime.kind != "ray" or runtime.address is not None:
        return  # a cluster joined by address is checked once joined
    need = workers * runtime.rollout.num_cpus + ranks * runtime.trainer.num_cpus
    if need > runtime.num_cpus:
        per_trainer = f"runtime.trainer.num_cpus={runtime.trainer.num_cpus:g}"
        trainer = per_trainer if ranks == 1 else f"runtime.trainer.ranks={ranks} × {per_trainer}"
        raise ValueError(
            f"rollout.workers={workers} × runtime.rollout.num_cpus={runtime.rollout.num_cpus:g} + "
            f"{trainer} = {need:g} exceeds the local cluster's runtime.num_cpus={runtime.num_cpus}"
        )
    if ranks > 1 and runtime.trainer.placement == "strict_spread":
        raise ValueError(
            f"runtime.trainer.placement 'strict_spread' puts each of runtime.trainer.ranks={ranks} on its own node, "
            "but a local cluster is one node: join a cluster (runtime.address) or use 'pack'"
        )
