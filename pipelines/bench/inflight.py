"""Sync, async and in-flight rollout under a long tail of response lengths.

    asyncrlhf bench --suite full --case inflight

The same task, seed, trainer and number of trained samples in three runs, back to back:
``sync``; ``async`` with whole batches (a batch holds the rollout device until its
longest response ends); and ``async`` with in-flight weight updates (the continuous
stream of :mod:`asyncrlhf.orchestration.stream`: a row that ends frees its slot for the
next group, weights load between decode steps). Prints samples/s of each, the ratios
in-flight / async and async / sync, and the trainer's bubble in each.

Settings:
  latency  SIMULATED rollout device: ``LongTailLatencyEngine``, geometric response
           lengths (median ``median`` tokens; one response in 20 has a 10× longer
           median), one token's wall time per decode step while any row of the call is
           still going. The time per token is calibrated so that a whole batch takes
           ``gen_to_train`` × a train step (generation-bound, as RL on long responses is).
           The trainer is real (the tiny Llama, AdamW) on one torch thread.
  hf       The real ``HFEngine`` and trainer in one process, one torch thread per side,
           the tiny model untrained (its responses run to the cap or a random EOS):
           reported as measured; the stream re-reads prompt and response so far at each
           of its engine calls, which costs compute here.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from asyncrlhf.models import TinyModelConfig, build_char_tokenizer, build_tiny_model
from asyncrlhf.orchestration import Orchestrator, RunConfig, RunHistory, Schedule
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.rollout.stub import LongTailLatencyEngine
from asyncrlhf.tasks import AdditionTask
from asyncrlhf.training import OptimConfig, TrainerWorker
from pipelines.bench._timing import summarize
from pipelines.bench.pipeline import _stub_reward

MODES = ("sync", "async", "inflight")


def _build(setting: str, mode: str, seconds_per_token: float, params: dict[str, Any]) -> Orchestrator:
    tokenizer = build_char_tokenizer()
    seed, cap = params["seed"], params["max_new_tokens"]
    model = build_tiny_model(tokenizer, TinyModelConfig(), seed=seed)
    if setting == "latency":
        engine: Any = LongTailLatencyEngine(
            seconds_per_token, median=params["median"], vocab_size=len(tokenizer), max_new_tokens=cap, seed=seed
        )
    else:
        sampling = Sampling(max_new_tokens=cap)
        engine = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, sampling=sampling, seed=seed)
    streams = mode == "inflight"
    schedule = Schedule(
        "sync" if mode == "sync" else "async",
        params["group"],
        params["prompts"],
        params["max_staleness"],
        inflight=streams,
        chunk_tokens=params["chunk_tokens"],
    )
    trainer = TrainerWorker(model, tokenizer.pad_token_id, "grpo", optim=OptimConfig(lr=1e-4), seed=seed)
    task = AdditionTask(tokenizer, digits=2, seed=seed)
    config = RunConfig(
        schedule,
        task.train_problems(),
        _stub_reward,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        verify_weights=setting != "latency",  # the latency model holds no weights to checksum
    )
    return Orchestrator(engine, trainer, config)


def _median_phase(history: RunHistory, worker: str, phase: str, skip: int = 2) -> float:
    durations = [e.end - e.start for e in history.timeline if e.worker == worker and e.phase == phase]
    return statistics.median(durations[skip:])


def calibrate(params: dict[str, Any]) -> float:
    """Seconds per token making a whole batch (its longest response) take
    ``gen_to_train`` × a train step."""
    probe = _build("latency", "sync", 0.0, params)
    history = probe.run(8)
    t_train = _median_phase(history, "trainer", "train")
    steps = [e.end - e.start for e in history.timeline if e.phase == "generate"]
    # a zero-latency call costs our CPU only; the modelled device adds one token's time per decode step
    longest = params["max_new_tokens"]  # a batch of hundreds of rows almost always reaches the cap
    return max(0.0, params["gen_to_train"] * t_train - statistics.median(steps)) / longest


def run(setting: str = "latency", steps: int = 20, repeats: int = 3, **overrides: Any) -> dict[str, Any]:
    """``repeats`` rounds of the three modes; ratios taken within each round."""
    params = {
        "seed": 0,
        "prompts": 16,
        "group": 8,
        "max_staleness": 1,
        "chunk_tokens": 4,
        "median": 6.0,
        "max_new_tokens": 64,
        "gen_to_train": 2.0,
        **overrides,
    }
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per side: the trainer's, the rollout thread's
    try:
        rounds = [_round(setting, steps, params) for _ in range(repeats)]
    finally:
        torch.set_num_threads(previous)
    out: dict[str, Any] = {"setting": setting, "steps": steps, "repeats": repeats, **params}
    for key in ("inflight_vs_async", "async_vs_sync", "seconds_per_token", "median_length", "p95_length"):
        out[key] = summarize([r[key] for r in rounds])
    for mode in MODES:
        out[mode] = {k: summarize([r[mode][k] for r in rounds]) for k in ("samples_per_s", "bubble_frac_trainer")}
    return out


def _round(setting: str, steps: int, params: dict[str, Any]) -> dict[str, Any]:
    seconds_per_token = calibrate(params) if setting == "latency" else 0.0
    result: dict[str, Any] = {"seconds_per_token": seconds_per_token}
    lengths: list[int] = []
    for mode in MODES:
        orchestrator = _build(setting, mode, seconds_per_token, params)
        seen: list[int] = []
        step = orchestrator.trainer.step

        def counted(experiences: Any, step: Any = step, seen: list[int] = seen) -> dict[str, float]:
            seen.extend(e.response_ids.shape[0] for e in experiences)
            return step(experiences)

        orchestrator.trainer.step = counted  # type: ignore[method-assign]
        start = time.perf_counter()
        history = orchestrator.run(steps)
        wall = time.perf_counter() - start
        result[mode] = {
            "samples_per_s": steps * params["prompts"] * params["group"] / wall,
            "bubble_frac_trainer": history.summary["perf/bubble_frac_trainer"],
        }
        lengths = lengths or seen
    ordered = sorted(lengths)
    result["median_length"] = float(ordered[len(ordered) // 2])
    result["p95_length"] = float(ordered[int(0.95 * (len(ordered) - 1))])
    result["inflight_vs_async"] = result["inflight"]["samples_per_s"] / result["async"]["samples_per_s"]
    result["async_vs_sync"] = result["async"]["samples_per_s"] / result["sync"]["samples_per_s"]
    return result
