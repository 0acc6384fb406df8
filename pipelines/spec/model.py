"""The experiment's model section: the built-in tiny Llama (its shape and warm start) or
a local Hugging Face directory, where it runs, its precision, and LoRA adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pipelines.spec.files import _Section, when

__all__ = ["LoraSpec", "ModelSpec", "WarmStartSpec"]

# When a field applies (else it is left out of a run's params): see pipelines.spec.files.when.
TINY, PRETRAINED = when(kind=["tiny"]), when(kind=["pretrained"])


class WarmStartSpec(_Section):
    """The defaults are those of the shipped start checkpoint (loaded, not trained);
    any other setting builds and caches its own warm start on first use."""

    steps: int = Field(550, ge=0, description="Supervised warm-start steps on the addition task (0: none).")
    batch_size: int = Field(128, ge=1, description="Problems per warm-start step.")
    lr: float = Field(3e-3, gt=0, description="Warm-start AdamW learning rate.")
    seed: int = Field(
        0, ge=0, description="Seeds the warm start; apart from the run's seed, so seeds vary the RL run, not its start."
    )


class LoraSpec(_Section):
    """LoRA adapters (``peft``): only they train and are checkpointed; rollout engines get
    the merged weights."""

    r: int = Field(8, ge=1, description="Adapter rank.")
    alpha: float = Field(16.0, gt=0, description="Scale: the update is alpha / r · B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        description="Modules to adapt, by name (the tiny model's linear layers: q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj).",
    )


class ModelSpec(_Section):
    kind: Literal["tiny", "pretrained"] = Field(
        "tiny",
        description="'tiny': the built-in Llama-style model, warm-started and cached; "
        "'pretrained': a local Hugging Face model directory given by `path`.",
    )
    path: str | None = Field(
        None, description="Local Hugging Face model directory (kind 'pretrained').", json_schema_extra=PRETRAINED
    )
    hidden_size: int = Field(128, ge=8, description="Tiny model: hidden width.", json_schema_extra=TINY)
    intermediate_size: int = Field(256, ge=8, description="Tiny model: MLP width.", json_schema_extra=TINY)
    num_layers: int = Field(2, ge=1, description="Tiny model: transformer blocks.", json_schema_extra=TINY)
    num_heads: int = Field(
        4, ge=1, description="Tiny model: attention heads (must divide hidden_size).", json_schema_extra=TINY
    )
    warm_start: WarmStartSpec = Field(
        default_factory=WarmStartSpec, description="Tiny model: warm start.", json_schema_extra=TINY
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where model, engine and trainer run.")
    dtype: Literal["float32", "float64"] = Field(
        "float32",
        description="Precision of the weights, the trainer and the HF engine. float64 is for exactness checks "
        "(a trainer group against one process, a resume against the uninterrupted run): float rounding then "
        "parts runs a hundred million times later (transformers still takes norms and rotary embeddings in "
        "float32, and engines sample from float32 probabilities and record float32 log-probs).",
    )
    lora: LoraSpec | None = Field(None, description="Train LoRA adapters instead of every weight (null: full).")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.kind == "pretrained":
            if self.path is None:
                raise ValueError("kind 'pretrained' needs a path")
            if not (Path(self.path) / "config.json").is_file():
                raise ValueError(
                    f"path {self.path!r} is not a Hugging Face model directory (no config.json; "
                    "`asyncrlhf chat-model --out DIR` builds a small one)"
                )
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}")
        return self

    @property
    def torch_dtype(self) -> Any:
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)
