"""LoRA through ``peft``: only low-rank adapters train; rollout engines get merged weights.

:func:`apply_lora` wraps a causal LM with adapters on the named modules (base weights
frozen). A :class:`~asyncrlhf.training.TrainerWorker` over such a model trains and
checkpoints the adapters alone, and publishes :func:`merged_state_dict`: the base
model's own names and shapes, each adapted weight ``W + (alpha / r) · B A`` computed out
of place (merging in place and back would drift the frozen weights by rounding), so an
engine built from the base architecture loads it as it loads any published version.
``peft`` is imported only here, when a spec asks for LoRA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "LoraSettings",
    "adapter_state_dict",
    "apply_lora",
    "check_targets",
    "is_lora",
    "load_adapter_state",
    "merge_state",
    "merged_state_dict",
    "write_adapter",
]


@dataclass(frozen=True)
class LoraSettings:
    """Rank ``r``, scale ``alpha`` (the update is ``alpha / r · B A``), dropout on the
    adapter's input, and the module names (suffixes, as ``peft`` matches them) to adapt."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Sequence[str] = ("q_proj", "v_proj")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """``model`` with adapters (a ``peft`` model); a ValueError naming the modules when
    none of ``target_modules`` is in it."""
    from peft import LoraConfig, get_peft_model

    check_targets(model, settings.target_modules)
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def check_targets(model: Any, target_modules: Sequence[str]) -> None:
    """A ValueError naming the ``target_modules`` that match no module of ``model`` (it
    may be on the meta device)."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(
            f"target_modules: {missing} match no module of the model (its linear layers: {', '.join(linear)})"
        )


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged, copied, under the base's names."""
    return merge_state(model, model.state_dict(), copy=True)


def merge_state(model: Any, state: dict[str, torch.Tensor], copy: bool = False) -> dict[str, torch.Tensor]:
    """``state`` (the peft ``model``'s own state dict, or one gathered whole from its
    shards) under the base model's names, each adapted weight ``W + (alpha / r) · B A``
    out of place; the other tensors are ``state``'s own unless ``copy``."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            weight = state[f"{name}.base_layer.weight"]
            for adapter in module.active_adapters:
                a, b = state[f"{name}.lora_A.{adapter}.weight"], state[f"{name}.lora_B.{adapter}.weight"]
                delta = (b @ a) * module.scaling[adapter]
                weight = weight + (delta.T if module.fan_in_fan_out else delta).to(weight.dtype)
            merged[f"{name}.weight"] = weight
        out = {}
        for name, tensor in state.items():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            if name not in merged:
                merged[name] = tensor.detach().clone() if copy else tensor
            out[name.removeprefix(prefix)] = merged[name]
    return out


def adapter_state_dict(model: Any, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The adapters' weights alone (what a checkpoint keeps), from ``model`` or from
    ``state``, its state dict gathered whole."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, state_dict=state).items()}


def load_adapter_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"the checkpoint's adapter has weights this model lacks: {unexpected[:3]}")


def write_adapter(adapter: dict[str, Any], folder: str) -> None:
    """Write what ``TrainerWorker.adapter()`` returns as ``peft`` saves an adapter
    (``adapter_config.json``, ``adapter_model.safetensors``): ``PeftModel.from_pretrained``
    loads it onto the base model."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    LoraConfig(**{k: v for k, v in adapter["config"].items() if k != "peft_type"}).save_pretrained(folder)
    weights = {k: v.contiguous() for k, v in adapter["weights"].items()}
    save_file(weights, f"{folder}/adapter_model.safetensors", metadata={"format": "pt"})
