"""Build a start checkpoint: the explicit ``asyncrlhf warmstart`` command.

The default start checkpoint ships with the package (``asyncrlhf/checkpoints/``):
training it again on another CPU gives other weights (float kernels differ), so
rebuilding is never a side effect of a run. This module builds one from a spec's
``model`` section, measures its held-out greedy accuracy on the spec's task, and
records both in the checkpoint's manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.spec import ExperimentSpec

__all__ = ["greedy_accuracy", "write_start_checkpoint"]


def greedy_accuracy(path: str | Path, spec: ExperimentSpec) -> float:
    """Held-out greedy accuracy of the policy in ``path`` on ``spec``'s task (CPU)."""
    from asyncrlhf.models import load_pretrained
    from asyncrlhf.orchestration.evaluate import evaluate_accuracy, greedy_engine
    from pipelines.spec.tasks import build_task

    model, tokenizer = load_pretrained(path)
    engine = greedy_engine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, spec.rollout.max_new_tokens)
    problems = build_task(spec, tokenizer).eval_problems()
    return evaluate_accuracy(engine, problems, tokenizer.eos_token_id, tokenizer.pad_token_id)


def write_start_checkpoint(spec: ExperimentSpec, out: Path) -> dict[str, Any]:
    """Warm-start ``spec``'s tiny model into ``out`` and record its greedy accuracy.

    Returns the manifest written beside the weights.

    Raises:
        ValueError: the spec's model is not the tiny one, or ``out`` already exists.
    """
    from asyncrlhf.models import build_policy
    from pipelines.run import tiny_configs

    if spec.model.kind != "tiny":
        raise ValueError(f"model.kind={spec.model.kind!r}: only the tiny model is warm-started here")
    if out.exists():
        raise ValueError(f"--out {out} already exists: choose a new directory (nothing is overwritten)")
    build_policy(*tiny_configs(spec), out)
    manifest_path = out / "asyncrlhf.json"
    manifest = json.loads(manifest_path.read_text())
    task = spec.task
    manifest["eval"] = {
        "task": task.kind,
        "digits": task.digits,
        "eval_size": task.eval_size,
        "eval_seed": task.eval_seed,
        "max_new_tokens": spec.rollout.max_new_tokens,
        "greedy_accuracy": greedy_accuracy(out, spec),
    }
    staged = manifest_path.with_suffix(".tmp")
    staged.write_text(json.dumps(manifest, indent=2) + "\n")
    staged.replace(manifest_path)
    return manifest
