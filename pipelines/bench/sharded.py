"""Per-rank memory of a trainer group against one trainer process, for a model of about
50M parameters: N gloo ranks (one process each) build the model, train two steps on the
same batch three times, publishing the weights and evaluating after the second; each
reports its resident memory less its memory before the model was built (the interpreter,
torch) in three phases: training (the largest of the samples after each step, the third
included: nothing of a publication may outlive it), publishing (the largest sample while
the weights stream out in the object-store publication's pieces, each dropped once its
checksum is taken, as ``ray.put`` hands it on) and evaluating (greedy generation on the
live model, every rank together), so the figures are what the training state (weights,
gradients, AdamW's moments, activations), a publication and an evaluation take on that rank.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any

__all__ = ["FIFTY_M", "run", "run_lora"]

FIFTY_M = {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12}


def _rss() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _batch(tokenizer: Any, rows: int = 8) -> list[Any]:
    import torch

    from asyncrlhf.types import Experience

    out = []
    for i in range(rows):
        prompt = torch.tensor([1, 10 + i % 5, 20 + i % 7, 3])
        response = torch.tensor([5 + (i + j) % 9 for j in range(4 + i % 6)])
        out.append(Experience(prompt, response, torch.full((len(response),), -2.0), float(i % 2), 0, i // 2, 1.0))
    return out


def _rank(rank: int, world: int, port: int, parallel: str, queue: Any, lora: bool = False) -> None:
    import time

    import torch
    import torch.distributed as dist

    from asyncrlhf.models import TinyModelConfig, build_char_tokenizer, build_tiny_model
    from asyncrlhf.training import OptimConfig, TrainerWorker
    from asyncrlhf.training.sharded import ShardedTrainer

    torch.set_num_threads(1)
    if world > 1:
        timeout = datetime.timedelta(seconds=300)
        dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", timeout=timeout, world_size=world, rank=rank)
    try:
        before = _rss()
        tokenizer = build_char_tokenizer()
        config = TinyModelConfig(**FIFTY_M, max_position_embeddings=64)
        model = build_tiny_model(tokenizer, config, seed=0)
        parameters = sum(p.numel() for p in model.parameters())
        if lora:
            from asyncrlhf.training.lora import LoraSettings, apply_lora

            model = apply_lora(model, LoraSettings(r=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")))
        cls, extra = (ShardedTrainer, {"parallel": parallel}) if world > 1 else (TrainerWorker, {})
        trainer = cls(model, tokenizer.pad_token_id, "ppo", {}, OptimConfig(lr=1e-5), seed=0, **extra)
        del model
        batch, training, seconds = _batch(tokenizer), [], []
        for step in range(3):
            start = time.perf_counter()
            trainer.step(batch)  # the third frees the second's publication
            seconds.append(time.perf_counter() - start)
            training.append(_rss())
            if step == 1:
                publishing = _publish(trainer)
                evaluating = _evaluate(trainer, tokenizer)
        seconds = seconds[1]  # the second step's: the first allocates the moments
        queue.put((rank, max(training) - before, publishing - before, parameters, seconds, evaluating - before))
        queue.close()
        queue.join_thread()  # the feeder thread has written it before os._exit
    finally:
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()
    os._exit(0)  # no C++ static destructors at exit (see tests/training/test_sharded.py)


def _publish(trainer: Any) -> int:
    """The largest resident memory while the weights stream out (see the module's doc)."""
    from asyncrlhf.models import publish_pieces

    _, samples = publish_pieces(trainer.stream_state(), lambda piece: _rss())
    return max([_rss(), *samples])


def _evaluate(trainer: Any, tokenizer: Any) -> int:
    """Resident memory after greedy responses to 32 prompts on the live model."""
    from asyncrlhf.orchestration.evaluate import greedy_engine

    engine = greedy_engine(
        trainer.inference_model(), tokenizer.eos_token_id, tokenizer.pad_token_id, 16, trainer.generation_stop()
    )
    engine.generate([_prompt(i) for i in range(32)])
    return _rss()


def _prompt(i: int) -> Any:
    import torch

    return torch.tensor([1, 10 + i % 5, 20 + i % 7, 3, 30 + i % 3])


def _group(world: int, parallel: str, lora: bool = False) -> list[tuple[int, int, int, int, float, int]]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [context.Process(target=_rank, args=(r, world, port, parallel, queue, lora)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        out = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            p.kill()
    return sorted(out)


def run(worlds: tuple[int, ...] = (1, 2), parallel: str = "fsdp") -> dict[str, Any]:
    """Per world size and phase (``training``: the steps; ``publishing``: streaming the
    weights out; ``evaluating``: generating on the live model): each rank's memory (bytes)
    and the largest rank's ratio to one process's. The ranks run with glibc's mmap threshold fixed, so
    freed tensors leave the resident set and it measures what is held."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the spawned ranks
    ranks = {world: _group(world, parallel) for world in worlds}
    out: dict[str, Any] = {"parameters": ranks[worlds[0]][0][3]}
    for phase, column in (("training", 1), ("publishing", 2), ("evaluating", 5)):
        per_rank = {world: [r[column] for r in rows] for world, rows in ranks.items()}
        one = max(per_rank[1])
        out[phase] = {"per_rank": per_rank, "ratio": {w: max(v) / one for w, v in per_rank.items()}}
    return out


def run_lora() -> dict[str, float]:
    """LoRA (r = 8 on the attention projections) against full fine-tuning, one process
    each: training memory and the second step's time, as ratios."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    (full,), (lora,) = _group(1, "fsdp"), _group(1, "fsdp", lora=True)
    return {
        "full_mb": full[1] / 2**20,
        "lora_mb": lora[1] / 2**20,
        "memory_ratio": lora[1] / full[1],
        "step_ratio": lora[4] / full[4],
    }
