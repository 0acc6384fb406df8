"""The experiment's model section: the built-in tiny Llama (its shape and warm start) or
a local Hugging Face directory, where it runs, its precision, and LoRA adapters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipelines.spec.files import _Section, when

__all__ = ["LoraSpec", "ModelSpec", "WarmStartSpec", "model_folder_problem"]

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

    @field_validator("path")
    @classmethod
    def _loadable(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None and info.data.get("kind") == "pretrained":
            problem = model_folder_problem(path)
            if problem:
                raise ValueError(problem)
        return path

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.kind == "pretrained" and self.path is None:
            raise ValueError("kind 'pretrained' needs a path")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}")
        return self

    @property
    def torch_dtype(self) -> Any:
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


def model_folder_problem(path: str) -> str | None:
    """Why a local Hugging Face folder cannot load, in a few words (None: it looks
    loadable): no folder, no or malformed ``config.json``, no tokenizer, no weights, or
    a weights file whose header is unreadable. Only headers are read: it is cheap."""
    folder = Path(path)
    hint = "(`asyncrlhf chat-model --out DIR` builds a small one)"
    if not folder.is_dir():
        return f"no such directory {hint}"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"not a Hugging Face model directory: no config.json {hint}"
    except (OSError, ValueError) as err:
        return f"config.json is not readable JSON ({type(err).__name__}: {err})"
    if not isinstance(config, dict) or not (config.get("model_type") or config.get("auto_map")):
        return "config.json names no model_type"
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return f"no tokenizer in it (none of {', '.join(_TOKENIZER_FILES)}) {hint}"
    weights = [file for pattern in _WEIGHT_FILES for file in sorted(folder.glob(pattern))]
    if not weights:
        return "no weights in it (no *.safetensors or pytorch_model.bin)"
    for file in weights:
        if file.suffix == ".safetensors":
            problem = _safetensors_problem(file)
            if problem:
                return f"{file.name} is damaged: {problem}"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """A safetensors file's header (an 8-byte length, then JSON) checked, nothing else read."""
    try:
        with open(file, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return "shorter than its header"
            size = int.from_bytes(head, "little")
            if size > min(file.stat().st_size - 8, 100_000_000):
                return f"its header claims {size} bytes, more than the file holds"
            header = json.loads(handle.read(size).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return f"its header is not readable ({type(err).__name__}: {err})"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, IndexError, TypeError, ValueError):
        return "its header is not a table of tensors"
    if 8 + size + end > file.stat().st_size:
        return f"truncated: its tensors end at byte {8 + size + end}, the file has {file.stat().st_size}"
    return None
