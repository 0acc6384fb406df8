"""Learning across CPUs and seeds: the quick start's held-out accuracy gain.

    asyncrlhf bench --suite matrix                      # 3 kernel settings × seeds 0 1 2
    asyncrlhf bench --suite full --case learning        # this machine's kernels × seeds 0 1 2

Float results depend on the CPU: PyTorch picks its vectorised kernels by CPU capability,
MKL its GEMM code path and oneDNN its ISA. Each can be capped by an environment variable
read when the library loads, which emulates an older machine on a newer one, so every
cell runs in a fresh subprocess:

    native   the environment as given: this CPU's best, or whatever the caller capped
    avx2     ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2
    default  ATEN_CPU_CAPABILITY=default, MKL_ENABLE_INSTRUCTIONS=SSE4_2, ONEDNN_MAX_CPU_ISA=SSE41

Every cell starts from the shipped start checkpoint (identical weights everywhere); the
seed varies sampling and data order. Reported: start and final greedy accuracy on the
fixed held-out set, the gain, and the run's wall time; then the mean, standard deviation
and range of the gain over all cells, and per kernel setting.

Cells run one after another: two torch processes on a 2-core machine oversubscribe
its cores (OpenMP threads spin), which slows both by an order of magnitude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipelines.sweeps.stats import summarize

REPO = Path(__file__).resolve().parents[2]  # the folder holding the pipelines package (a clone, or site-packages)
QUICKSTART = Path(__file__).with_name("quickstart.yaml")  # a link to experiments/ in a clone

KERNELS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
_KERNEL_VARS = {name for variables in KERNELS.values() for name in variables}


def run_cell(seed: int, overrides: list[str], spec_path: Path = QUICKSTART) -> dict[str, Any]:
    """One untracked run of ``spec_path`` at ``seed`` in this process."""
    import torch

    from pipelines.run import run_experiment
    from pipelines.spec import load_spec

    spec = load_spec(spec_path, [*overrides, f"seed={seed}"])
    result = run_experiment(spec, track=False)
    start = result.history.initial_metrics["eval/accuracy"]
    final = result.final_metrics["eval/accuracy"]
    return {
        "seed": seed,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "start": start,
        "final": final,
        "gain": final - start,
        "curve": [[0, start], *([step, value] for step, value in result.history.metric("eval/accuracy"))],
        "run_s": result.history.summary["time/total_s"],
    }


def run_in_subprocess(kernels: str, seed: int, overrides: list[str], spec_path: Path = QUICKSTART) -> dict[str, Any]:
    """:func:`run_cell` in a fresh interpreter with ``kernels``' variables set (``native``
    keeps the caller's, so ``ATEN_CPU_CAPABILITY=avx2 asyncrlhf bench`` measures AVX2)."""
    env = dict(os.environ)
    if kernels != "native":
        env = {k: v for k, v in env.items() if k not in _KERNEL_VARS} | KERNELS[kernels]
    with tempfile.TemporaryDirectory() as tmp:
        request, out = Path(tmp) / "request.json", Path(tmp) / "cell.json"
        request.write_text(json.dumps({"seed": seed, "overrides": overrides, "spec": str(spec_path)}))
        command = [sys.executable, "-m", "pipelines.bench.learning", str(request), str(out)]
        subprocess.run(command, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        cell = json.loads(out.read_text())
    return {"kernels": kernels, **cell}


def summarize_gains(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, standard deviation (n − 1), 95% CI half-width, n, min and max of the gains."""
    gains = [c["gain"] for c in cells]
    return {**summarize(gains).as_dict(), "min": min(gains), "max": max(gains)}


def run_matrix(
    kernels: list[str], seeds: list[int], overrides: list[str], spec_path: Path = QUICKSTART, log: Any = print
) -> dict[str, Any]:
    """Every kernel setting × seed, one subprocess each; cells and summaries."""
    cells = []
    for name in kernels:
        for seed in seeds:
            cell = run_in_subprocess(name, seed, overrides, spec_path)
            log(
                f"  {name:<8} ({cell['cpu_capability']}) seed {seed}: {cell['start']:.3f} -> {cell['final']:.3f} "
                f"(gain {cell['gain']:+.3f}) in {cell['run_s']:.0f} s",
                flush=True,
            )
            cells.append(cell)
    by_kernels = {name: summarize_gains([c for c in cells if c["kernels"] == name]) for name in kernels}
    return {
        "spec": str(spec_path),
        "overrides": overrides,
        "cells": cells,
        "all": summarize_gains(cells),
        "by_kernels": by_kernels,
    }


if __name__ == "__main__":  # one cell, for run_in_subprocess: python -m pipelines.bench.learning REQUEST.json OUT.json
    request = json.loads(Path(sys.argv[1]).read_text())
    cell = run_cell(request["seed"], request["overrides"], Path(request["spec"]))
    Path(sys.argv[2]).write_text(json.dumps(cell))
