"""Will the run fit? A memory estimate from the spec alone, checked before anything starts.

A spec can be valid field by field and still ask for terabytes: ``trainer.batch_size``
of a billion, ``rollout.max_new_tokens`` of a billion, a model a million wide. Such a run
used to be created in MLflow and then hang, or die in an allocator, minutes later.
:func:`check_fits` refuses it at once, naming the field that asks most, from a deliberately
rough upper estimate (``model.dtype`` everywhere, a full batch in one pass) compared with the
memory this machine (or the GPU) has available. Ordinary runs need megabytes to a few
gigabytes, far from the line; the estimate exists to catch the absurd, not to plan.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.spec import ExperimentSpec
from pipelines.spec.files import SpecError

__all__ = ["available_bytes", "check_fits", "estimate_bytes", "rank_bytes", "weight_bytes"]

_F32 = 4
_JSONL_PROMPT_TOKENS = 64  # assumed prompt length of a JSONL task (the file is read later)
_VOCAB = 64  # the tiny model's character vocabulary, rounded up


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    raise AssertionError


def _parameters(spec: ExperimentSpec) -> int:
    model = spec.model
    if model.kind == "pretrained":
        assert model.path is not None
        weights = [p for p in Path(model.path).glob("*") if p.suffix in (".safetensors", ".bin", ".pt")]
        return sum(p.stat().st_size for p in weights) // _F32
    h, i, layers = model.hidden_size, model.intermediate_size, model.num_layers
    return layers * (4 * h * h + 3 * h * i + 2 * h) + 2 * _VOCAB * h + h


def _width(spec: ExperimentSpec) -> int:
    """Bytes per number: those of ``model.dtype``."""
    return 8 if spec.model.dtype == "float64" else _F32


def weight_bytes(spec: ExperimentSpec) -> int:
    """The policy's weights in ``model.dtype`` (what each version published to rollout weighs)."""
    return _parameters(spec) * _width(spec)


def rank_bytes(spec: ExperimentSpec) -> int:
    """One trainer rank's weights, gradients, AdamW moments and reference model: 1/N of
    them under FSDP2 (``runtime.trainer.parallel: fsdp``), all of them under DDP; rank 0
    of a group also holds what it publishes: one piece of the object-store publication
    (the weights stream out piece by piece), or the whole weights staged for a
    ``collective`` sync's broadcast. The evaluation runs on the sharded model."""
    from asyncrlhf.distributed.weights import choose_sync
    from asyncrlhf.models import PIECE_BYTES

    ranks, parallel = spec.runtime.trainer.ranks, spec.runtime.trainer.parallel
    weights = weight_bytes(spec)
    state = (4 + (1 if spec.algorithm.uses_reference else 0)) * weights
    share = state // ranks if parallel == "fsdp" else state
    if ranks == 1:
        return share
    staged = choose_sync(spec.runtime.weight_sync, weights) == "collective"
    return share + (weights if staged else min(weights, PIECE_BYTES))


def estimate_bytes(spec: ExperimentSpec) -> dict[str, int]:
    """Rough upper bounds, by what asks: ``model`` (every trainer rank's
    :func:`rank_bytes` and each rollout engine's copy), ``batch`` (one training pass over
    ``trainer.micro_batch_size`` sequences, or the batch, and one generation pass over
    ``trainer.batch_size``) and ``eval`` (the held-out
    problems). Everything is counted as on one machine, as a local cluster is."""
    model, b, n = spec.model, spec.trainer.batch_size, spec.rollout.max_new_tokens
    prompt = 2 * spec.task.digits + 3 if spec.task.kind == "addition" else _JSONL_PROMPT_TOKENS
    t = prompt + n
    h, i, layers, heads = model.hidden_size, model.intermediate_size, model.num_layers, model.num_heads
    rows = min(b, spec.trainer.micro_batch_size or b)  # rows through one forward and backward
    width = _width(spec)
    train = rows * t * (layers * (10 * h + 2 * i + 2 * heads * t) + 3 * _VOCAB) * width
    generate = b * t * layers * 2 * h * width + b * _VOCAB * width
    eval_size = spec.task.eval_size if spec.task.kind == "addition" else 0
    return {
        "model": spec.runtime.trainer.ranks * rank_bytes(spec) + spec.rollout.workers * weight_bytes(spec),
        "batch": train + generate,
        "eval": eval_size * (prompt + n) * 64,  # token tensors and their Python objects
    }


def available_bytes(device: str = "cpu") -> int:
    """Memory available now: the GPU's free memory for CUDA, else the machine's
    ``MemAvailable`` (Linux), else its free physical pages."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(spec: ExperimentSpec, available: int | None = None) -> None:
    """A SpecError naming the field that asks most if the estimate exceeds ``available``
    (default: what this machine, or its GPU, has free)."""
    parts = estimate_bytes(spec)
    total = sum(parts.values())
    device = "cuda" if spec.model.device in ("cuda", "auto") and _has_cuda() else "cpu"
    limit = available_bytes(device) if available is None else available
    if total <= limit:
        return
    model, trainer, rollout = spec.model, spec.trainer, spec.rollout
    cause = max(parts, key=parts.__getitem__)
    if cause == "model":
        field = (
            f"model.hidden_size={model.hidden_size} (intermediate_size {model.intermediate_size}, "
            f"num_layers {model.num_layers})"
        )
    elif cause == "eval":
        field = f"task.eval_size={spec.task.eval_size}"
    elif rollout.max_new_tokens > trainer.batch_size:
        field = f"rollout.max_new_tokens={rollout.max_new_tokens} (with trainer.batch_size {trainer.batch_size})"
    else:
        field = f"trainer.batch_size={trainer.batch_size} (with rollout.max_new_tokens {rollout.max_new_tokens})"
    where = "on the GPU" if device == "cuda" else "on this machine"
    raise SpecError(
        f"{field}: the run needs about {_human(total)} of memory, more than the {_human(limit)} "
        f"available {where}; lower it"
    )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
