"""Learning across CPUs and seeds: the quick start's held-out accuracy gain.

    python -m benchmarks.learning                       # 3 kernel settings × seeds 0 1 2
    python -m benchmarks.learning --kernels native --seeds 0 1 2 --set orchestrator.mode=lagged
    python -m benchmarks.learning --cell --seed 0       # one run, in this process (JSON out)

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

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipelines.stats import summarize

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "experiments" / "quickstart.yaml"

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
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "benchmarks.learning", "--cell", "--seed", str(seed),
                   "--spec", str(spec_path), "--out", out.name]  # fmt: skip
        for override in overrides:
            command += ["--set", override]
        subprocess.run(command, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        cell = json.loads(Path(out.name).read_text())
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
            log(f"  {name:<8} ({cell['cpu_capability']}) seed {seed}: {cell['start']:.3f} -> {cell['final']:.3f} "
                f"(gain {cell['gain']:+.3f}) in {cell['run_s']:.0f} s", flush=True)  # fmt: skip
            cells.append(cell)
    by_kernels = {name: summarize_gains([c for c in cells if c["kernels"] == name]) for name in kernels}
    return {"spec": str(spec_path), "overrides": overrides, "cells": cells, "all": summarize_gains(cells),
            "by_kernels": by_kernels}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seed", type=int, default=0, help="with --cell: the run's seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key.path=value")
    parser.add_argument("--spec", type=Path, default=QUICKSTART)
    parser.add_argument("--cell", action="store_true", help="run one cell in this process")
    parser.add_argument("--out", type=Path, help="write the JSON result here")
    args = parser.parse_args(argv)
    if args.cell:
        result = run_cell(args.seed, args.overrides, args.spec)
    else:
        result = run_matrix(args.kernels, args.seeds, args.overrides, args.spec)
        s = result["all"]
        print(f"gain over {s['n']} cells: mean {s['mean']:+.3f} ± {s['std']:.3f} (sd), "
              f"range [{s['min']:+.3f}, {s['max']:+.3f}]")  # fmt: skip
        for name, k in result["by_kernels"].items():
            print(f"  {name:<8} mean {k['mean']:+.3f} ± {k['std']:.3f}, range [{k['min']:+.3f}, {k['max']:+.3f}]")
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    elif not args.cell:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
