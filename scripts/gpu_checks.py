"""The figures that need a GPU, measured in one run (scripts/gpu-checks.sh runs it after
the CUDA tests). Needs torch and transformers only: no Ray, MLflow or vLLM.

    python3 scripts/gpu_checks.py --out DIR [--steps 800] [--only rl,generation,reward,losses]

- ``rl``: the quick start's learning run (lagged GRPO, k = 1, the shipped start
  checkpoint) on the core's in-process runtime, trainer and engine on the GPU: held-out
  accuracy at each evaluation, ``rollout/logprob_gap`` (engine against trainer on the
  same weights), and the time per step.
- ``generation``: HF engine throughput (generated tokens/s) on the shipped model.
- ``reward``, ``losses``: the benchmark cases of ``asyncrlhf bench --suite cuda``, run
  here without the suite's MLflow logging.

Each section's result is written to ``DIR/gpu_checks.json`` as soon as it is done, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, not an installed copy


def environment() -> dict[str, Any]:
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "gpus": torch.cuda.device_count(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cpu_threads": torch.get_num_threads(),
    }


def rl(device: str, steps: int, log: Any) -> dict[str, Any]:
    """The quick start as ``experiments/quickstart.yaml`` sets it, built with the core alone."""
    from asyncrlhf.models import load_pretrained, pretrained_policy
    from asyncrlhf.orchestration import HeldOut, Orchestrator, RunConfig, Schedule
    from asyncrlhf.rewards import CompositeReward, RewardTerm
    from asyncrlhf.rollout import HFEngine, Sampling
    from asyncrlhf.tasks import AdditionTask
    from asyncrlhf.training import OptimConfig, TrainerWorker

    torch.manual_seed(0)
    model, tok = load_pretrained(pretrained_policy(), device)
    task = AdditionTask(tok, digits=2, seed=0, eval_size=200)
    reward = CompositeReward([RewardTerm("exact_match", 1.0)])
    options = {"loss_agg": "seq-mean-token-mean", "clip_eps": 0.2}
    optim = OptimConfig(lr=4.5e-4, warmup_updates=round(0.08 * steps), decay="cosine", total_updates=steps)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", options, optim, temperature=0.7, seed=0)
    sampling = Sampling(max_new_tokens=5, temperature=0.7)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling, seed=1, device=device)
    evals: list[dict[str, float]] = []

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        if "eval/accuracy" in metrics:
            row = {"step": step, "accuracy": metrics["eval/accuracy"]}
            evals.append(row)
            log(f"  rl step {step}: eval/accuracy {row['accuracy']:.3f}")

    config = RunConfig(
        Schedule("lagged", 8, 64, 1, 1, 1, max(1, steps // 8)),
        task.train_problems(),
        reward,
        tok.eos_token_id,
        tok.pad_token_id,
        held_out=HeldOut(task.eval_problems(), max_new_tokens=5),
        advantage="grpo",
        on_metrics=on_metrics,
    )
    start = time.perf_counter()
    history = Orchestrator(engine, trainer, config).run(steps)
    wall = time.perf_counter() - start
    gaps = [s["rollout/logprob_gap"] for s in history.steps if "rollout/logprob_gap" in s]
    rewards = [s["reward/mean"] for s in history.steps if "reward/mean" in s]
    return {
        "steps": steps,
        "device": str(trainer.device),
        "wall_s": wall,
        "step_s_median": statistics.median(s["time/step_s"] for s in history.steps if "time/step_s" in s),
        "evals": evals,
        "gain_points": 100 * (evals[-1]["accuracy"] - evals[0]["accuracy"]) if len(evals) > 1 else None,
        "reward_first_50": statistics.fmean(rewards[:50]) if rewards else None,
        "reward_last_50": statistics.fmean(rewards[-50:]) if rewards else None,
        "logprob_gap_max": max(gaps) if gaps else None,
        "staleness_mean": statistics.fmean(s["staleness/mean"] for s in history.steps if "staleness/mean" in s),
    }


def generation(device: str) -> dict[str, Any]:
    """Generated tokens/s of the HF engine on the shipped model (best of 3), at the quick
    start's batch and at 8× it, with a 32-token budget (sampling at temperature 1)."""
    from asyncrlhf.models import load_pretrained, pretrained_policy
    from asyncrlhf.rollout import HFEngine, Sampling
    from asyncrlhf.tasks import AdditionTask

    model, tok = load_pretrained(pretrained_policy(), device)
    problems = AdditionTask(tok, digits=2, seed=0).train_problems()
    out: dict[str, Any] = {"max_new_tokens": 32}
    for prompts in (64, 512):
        batch = [next(problems).prompt_ids for _ in range(prompts)]
        engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, Sampling(max_new_tokens=32), seed=0)
        engine.generate(batch[:8], 8)  # warm-up
        best = 0.0
        for _ in range(3):
            if device == "cuda":
                torch.cuda.synchronize()
            begin = time.perf_counter()
            samples = engine.generate(batch, 8)
            best = max(best, sum(s.response_ids.numel() for s in samples) / (time.perf_counter() - begin))
        out[f"tokens_per_s_{prompts}x8"] = best
    return out


def reward(device: str, small: bool) -> dict[str, Any]:
    from pipelines.bench import rewards

    shapes = [(16, 64)] if small else [(256, 1024), (1024, 4096)]
    return {f"B{b}_L{n}": rewards.run(b, n, device=device, repeats=3 if b * n > 1 << 20 else 10) for b, n in shapes}


def losses(device: str, small: bool) -> dict[str, Any]:
    from pipelines.bench import losses as bench

    return bench.run(1 << 12 if small else 1 << 22, repeats=10, device=device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--only", default="rl,generation,reward,losses")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a check of this script itself")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_checks.json"
    results: dict[str, Any] = {"environment": environment()}

    def log(line: str) -> None:
        print(line, flush=True)

    sections = {
        "rl": lambda: rl(args.device, args.steps, log),
        "generation": lambda: generation(args.device),
        "reward": lambda: reward(args.device, args.small),
        "losses": lambda: losses(args.device, args.small),
    }
    for name in args.only.split(","):
        log(f"== {name} on {args.device}")
        start = time.perf_counter()
        try:
            results[name] = sections[name]()
        except Exception as error:  # the other sections still run
            where = traceback.format_tb(error.__traceback__)[-4:]
            results[name] = {"error": f"{type(error).__name__}: {error}", "where": "".join(where)}
        results[name]["section_s"] = round(time.perf_counter() - start, 1)
        path.write_text(json.dumps(results, indent=1, default=str))
        log(json.dumps(results[name], default=str)[:3000])


if __name__ == "__main__":
    main()
