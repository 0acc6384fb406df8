"""What a spec asks of the runtime, read before anything is built: the Ray layout
(workers, per-actor resources, ranks, placement, weight sync) and a LoRA spec's target
modules against the model's own (on the meta device)."""

from __future__ import annotations

from typing import Any

import torch

from pipelines.spec import ExperimentSpec
from pipelines.spec.trust import code_trusted

__all__ = ["check_lora", "ray_layout"]


def ray_layout(spec: ExperimentSpec) -> Any:
    """The spec's :class:`~asyncrlhf.distributed.RayLayout` (``weight_sync: auto`` decided by the weights' size)."""
    from asyncrlhf.distributed import ActorResources, RayLayout
    from asyncrlhf.distributed.weights import choose_sync
    from pipelines.spec.memory import weight_bytes

    runtime = spec.runtime

    def resources(actor: Any) -> ActorResources:
        return ActorResources(actor.num_cpus, actor.num_gpus, actor.torch_threads or runtime.torch_threads)

    return RayLayout(
        spec.rollout.workers,
        resources(runtime.rollout),
        resources(runtime.trainer),
        runtime.max_restarts,
        seed=spec.seed + 1,
        ranks=runtime.trainer.ranks,
        placement=runtime.trainer.placement.upper(),
        weight_sync=choose_sync(runtime.weight_sync, weight_bytes(spec)),
    )


def check_lora(spec: ExperimentSpec, path: str) -> None:
    """``model.lora.target_modules`` against the model's module names (built on the meta
    device: nothing loaded), before any actor or run starts."""
    if spec.model.lora is None:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncrlhf.training.lora import check_targets

    with torch.device("meta"):
        trusted = code_trusted()
        config = AutoConfig.from_pretrained(path, trust_remote_code=trusted)
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trusted)
    try:
        check_targets(model, spec.model.lora.target_modules)
    except ValueError as err:
        raise ValueError(f"model.lora.{err}") from None
