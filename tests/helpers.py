"""Small real models for fast tests: a char tokenizer and a tiny Llama built from a config."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch

from asyncrlhf.models import TinyModelConfig, build_char_tokenizer, build_tiny_model

SMALL = TinyModelConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32
)


def small_model(seed: int = 0):  # type: ignore[no-untyped-def]
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer, SMALL, seed=seed), tokenizer


def even_first_token(generated_ids: torch.Tensor, answers: object, eos_token_id: int) -> torch.Tensor:
    """A dense tensor-native reward, so an untrained policy sees mixed rewards."""
    return (generated_ids[:, 0] % 2 == 0).float()


def patience(seconds: float) -> float:
    """A timeout for waiting on another process: ``seconds`` on an idle machine, scaled by
    how many runnable threads share each core now (a loaded machine is slower, not
    broken; a fixed 60 s expired at a load average of 5.8 on 2 cores)."""
    import os

    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def free_port() -> int:
    """A TCP port free on the loopback now (a server started next takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_ranks(target: Callable[..., None], world: int, *args: Any) -> None:
    """Run ``target(rank, world, *args)`` in ``world`` spawned processes (the ranks of a
    ``torch.distributed`` group); each must exit 0 within 300 s."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=target, args=(r, world, *args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=300)
        codes = [p.exitcode for p in procs]
        assert codes == [0] * world, f"rank exit codes {codes}"
    finally:
        for p in procs:
            p.kill()
