"""Where a quick-start step's time goes, and what the two step savings buy.

    asyncrlhf bench --suite full --case step
    python -c "from pipelines.bench import step; print(step.run())"

The workload is one quick-start step from the shipped start checkpoint: 64 training
problems of 2-digit addition × 8 samples at temperature 0.7, 5 new tokens, rewarded by
exact match, GRPO advantages per group. Each figure is a ratio of two timings taken in
interleaved rounds in the same run:

- ``generate``: :meth:`HFEngine.generate` reading each prompt once and repeating its KV
  cache for the group, against one prefill per row (the same rows, each prompt listed
  8 times with one sample each, which is what every row cost before).
- ``train``: :meth:`TrainerWorker.step` reading each prompt once (``share_prompts``)
  and leaving the rows whose advantage is 0 out of the pass (``skip_zero_advantage``),
  against reading every row whole (both off, what a step cost before); and with prompt
  sharing alone, to part the two. The skip's saving follows the share of rows with a
  zero advantage, reported beside it (``signal_rows``); it grows as more groups are
  solved, from about 30% of the rows at the start to about 55% by the quick start's end.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

from pipelines.bench._timing import measure_interleaved

PROMPTS, GROUP = 64, 8


def _batch(worker: Any, task: Any) -> list[Any]:
    """One quick-start batch, rolled out and rewarded as a run does, with GRPO advantages."""
    from asyncrlhf.losses import group_advantages

    experiences = worker.generate_batch(list(itertools.islice(task.train_problems(), PROMPTS)), "bench")
    advantages = group_advantages(torch.tensor([e.reward for e in experiences]), GROUP)
    for experience, advantage in zip(experiences, advantages.tolist(), strict=True):
        experience.advantage = advantage
    return experiences


def run(repeats: int = 10, threads: int = 1) -> dict[str, Any]:
    """Median [min – max] times of both pairs and their ratios (old / new)."""
    from asyncrlhf.models import load_pretrained, shipped_policy
    from asyncrlhf.rewards import CompositeReward, RewardTerm
    from asyncrlhf.rollout import HFEngine, RolloutWorker, Sampling
    from asyncrlhf.tasks.addition import AdditionTask
    from asyncrlhf.training import OptimConfig, TrainerWorker

    torch.set_num_threads(threads)
    model, tok = load_pretrained(shipped_policy())
    task = AdditionTask(tok, digits=2, seed=0)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, Sampling(max_new_tokens=5, temperature=0.7), seed=1)
    reward = CompositeReward([RewardTerm("exact_match", 1.0)])
    batch = _batch(RolloutWorker(engine, reward, GROUP, tok.eos_token_id, tok.pad_token_id), task)
    prompts = [e.prompt_ids for e in batch[::GROUP]]
    per_row = [p for p in prompts for _ in range(GROUP)]

    def trainer(skip: bool, share: bool) -> Any:
        # lr far below the quick start's: repeated steps on one batch must not move its advantages' meaning
        optim = OptimConfig(lr=1e-7)
        return TrainerWorker(
            copy.deepcopy(model),
            tok.pad_token_id,
            "grpo",
            {"loss_agg": "seq-mean-token-mean"},
            optim,
            temperature=0.7,
            skip_zero_advantage=skip,
            share_prompts=share,
        )

    whole, shared, both = trainer(False, False), trainer(False, True), trainer(True, True)
    times = measure_interleaved(
        {
            "generate_per_row": lambda: engine.generate(per_row, 1),
            "generate_shared": lambda: engine.generate(prompts, GROUP),
            "train_whole_rows": lambda: whole.step(batch),
            "train_shared_prompts": lambda: shared.step(batch),
            "train_shared_signal_rows": lambda: both.step(batch),
        },
        torch.device("cpu"),
        repeats=repeats,
    )
    share = sum(e.advantage != 0 for e in batch) / len(batch)
    return {
        "times_s": {name: {"median": t.median, "min": t.min, "max": t.max} for name, t in times.items()},
        # ratios of the least disturbed rounds (see pipelines.bench._timing.measure_interleaved)
        "generate_speedup": times["generate_per_row"].min / times["generate_shared"].min,
        "train_speedup": times["train_whole_rows"].min / times["train_shared_signal_rows"].min,
        "train_share_speedup": times["train_whole_rows"].min / times["train_shared_prompts"].min,
        "signal_rows": share,
    }


if __name__ == "__main__":
    print(run())
