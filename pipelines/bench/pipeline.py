"""Async vs sync: how well the orchestrator overlaps rollout with training.

    asyncrlhf bench --suite full --case pipeline       # both settings, 3 sync/async pairs each

Same task, seed and number of trained samples in ``sync`` and in ``async`` mode. Prints
samples/s of each, their ratio, the ideal ratio (T_gen + T_train) / max(T_gen, T_train)
from the phase times measured in the sync run, and both bubble fractions.

Settings:
  latency  Disaggregated rollout, SIMULATED: ``LatencyModelEngine`` stands for a rollout
           device of its own (e.g. a remote inference GPU). It returns stub samples and
           sleeps a fixed wall time per generated token, using almost no CPU of ours;
           the time per token is calibrated so that T_gen ≈ T_train. The trainer is
           real (the tiny Llama, AdamW) and gets one core (one torch thread), the other
           core being left to the rollout thread's own Python work. Async runs with
           max_staleness=2 by default, so one slow step on either side is absorbed
           instead of stalling the other. Targets in :data:`pipelines.bench.cases.TARGETS`.
  hf       The real ``HFEngine`` in the same process as the trainer. On a 2-core CPU the
           two compete for the same cores, so little overlap gain is possible: no target,
           the figures are reported as measured.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from asyncrlhf.models import TinyModelConfig, build_char_tokenizer, build_tiny_model, load_pretrained, pretrained_policy
from asyncrlhf.orchestration import Orchestrator, RunConfig, RunHistory, Schedule
from asyncrlhf.rewards import exact_match_reward
from asyncrlhf.rollout import HFEngine, LatencyModelEngine, Sampling
from asyncrlhf.tasks import AdditionTask
from asyncrlhf.training import OptimConfig, TrainerWorker
from pipelines.bench._timing import summarize


def _stub_reward(generated_ids: torch.Tensor, answers: Any, eos_token_id: int) -> torch.Tensor:
    # Stub tokens carry no answer; a parity reward gives the trainer non-zero advantages.
    return (generated_ids[:, 0] % 2 == 0).float()


def _phase_times(history: RunHistory, skip: int = 0) -> tuple[float, float]:
    """Median rollout-batch time (generate + reward) and median train-step time,
    skipping the first ``skip`` of each (warm-up)."""

    def median_of(worker_is_trainer: bool, phases: tuple[str, ...]) -> float:
        durations = [
            e.end - e.start
            for e in history.timeline
            if (e.worker == "trainer") == worker_is_trainer and e.phase in phases
        ]
        return statistics.median(durations[skip * len(phases) :])

    return median_of(False, ("generate",)) + median_of(False, ("reward",)), median_of(True, ("train",))


def _build(
    setting: str, mode: str, seconds_per_token: float, prompts: int, group: int, seed: int, max_staleness: int = 1
) -> Orchestrator:
    if setting == "latency":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, TinyModelConfig(), seed=seed)
        engine = LatencyModelEngine(seconds_per_token, vocab_size=len(tokenizer), max_new_tokens=8, seed=seed)
        reward = _stub_reward
    else:
        model, tokenizer = load_pretrained(pretrained_policy())
        engine = HFEngine(
            model, tokenizer.eos_token_id, tokenizer.pad_token_id, sampling=Sampling(max_new_tokens=5), seed=seed
        )
        reward = exact_match_reward
    task = AdditionTask(tokenizer, digits=2, seed=seed)
    trainer = TrainerWorker(model, tokenizer.pad_token_id, "grpo", optim=OptimConfig(lr=3e-4), seed=seed)
    config = RunConfig(
        Schedule(mode, group, prompts, max_staleness),
        task.train_problems(),
        reward,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        verify_weights=setting != "latency",  # the latency model holds no weights to checksum
    )
    return Orchestrator(engine, trainer, config)


def calibrate(prompts: int, group: int, seed: int) -> float:
    """Seconds per token that make a whole rollout batch (stub sampling, the modelled
    device latency, reward) take as long as a train step: T_gen ≈ T_train."""
    probe = _build("latency", "sync", 0.0, prompts, group, seed)
    history = probe.run(10)
    t_rollout, t_train = _phase_times(history, skip=3)  # with zero latency: our own CPU cost
    return max(0.0, t_train - t_rollout) / probe.engine.max_new_tokens


def run(
    setting: str = "latency",
    steps: int = 30,
    prompts: int = 32,
    group: int = 8,
    seed: int = 0,
    repeats: int = 3,
    max_staleness: int = 2,
    threads: int | None = None,
) -> dict[str, Any]:
    """Alternate ``repeats`` sync/async pairs of ``steps`` trainer steps each.

    The speed-up is taken within each pair (the two runs see the same machine state)
    and reported as the median over pairs, with min and max: on a shared machine the
    absolute speed drifts between runs more than the effect being measured. The latency
    model is recalibrated before each pair for the same reason.
    """
    previous = torch.get_num_threads()
    if threads is None:  # latency: the trainer's "device" is one core, the rollout thread has the other
        threads = 1 if setting == "latency" else previous
    torch.set_num_threads(threads)
    try:
        pairs = [_pair(setting, steps, prompts, group, seed, max_staleness) for _ in range(repeats)]
    finally:
        torch.set_num_threads(previous)

    results: dict[str, Any] = {
        "setting": setting,
        "steps": steps,
        "repeats": repeats,
        "samples_per_step": prompts * group,
        "threads": threads,
        "max_staleness": max_staleness,
    }
    for key in ("speedup", "ideal_speedup", "t_gen_s", "t_train_s", "t_train_async_s", "seconds_per_token"):
        results[key] = summarize([p[key] for p in pairs])
    for mode in ("sync", "async"):
        results[mode] = {
            key: summarize([p[mode][key] for p in pairs])
            for key in ("samples_per_s", "bubble_frac_rollout", "bubble_frac_trainer")
        }
    return results


def _pair(setting: str, steps: int, prompts: int, group: int, seed: int, max_staleness: int) -> dict[str, Any]:
    """One sync run and one async run on the same settings, back to back."""
    seconds_per_token = calibrate(prompts, group, seed) if setting == "latency" else 0.0
    pair: dict[str, Any] = {"seconds_per_token": seconds_per_token}
    for mode in ("sync", "async"):
        orchestrator = _build(setting, mode, seconds_per_token, prompts, group, seed, max_staleness)
        start = time.perf_counter()
        history = orchestrator.run(steps)
        wall = time.perf_counter() - start
        pair[mode] = {
            "samples_per_s": steps * prompts * group / wall,
            "bubble_frac_rollout": history.summary["perf/bubble_frac_rollout"],
            "bubble_frac_trainer": history.summary["perf/bubble_frac_trainer"],
            "history": history,
        }
    t_gen, t_train = _phase_times(pair["sync"]["history"])
    pair["t_gen_s"], pair["t_train_s"] = t_gen, t_train
    pair["t_train_async_s"] = _phase_times(pair["async"]["history"])[1]  # interference shows here
    pair["speedup"] = pair["async"]["samples_per_s"] / pair["sync"]["samples_per_s"]
    pair["ideal_speedup"] = (t_gen + t_train) / max(t_gen, t_train)
    return pair
