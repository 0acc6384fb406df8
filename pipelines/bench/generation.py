"""Generation throughput, Hugging Face against vLLM, and vLLM's weight update.

    .venv-vllm/bin/asyncrlhf bench --suite full --case generation --no-track

Needs vLLM (``bash scripts/setup-vllm.sh`` makes ``.venv-vllm``); without it the case
reports why and no figure. On the shipped checkpoint, the same prompts (the addition
task's), samples per prompt, temperature and response cap for both engines:

* generated tokens/s of ``HFEngine`` and of ``VLLMEngine`` (sampled at temperature 1,
  float32, EOS ending a response as in a run), best of ``repeats`` after a warm-up call
  each, and their ratio;
* a weight update: ``VLLMEngine.load_weights`` (``reload_weights`` in place, prefix
  cache reset, the log-prob probe) against a full reload, a new engine built from the
  weights saved to a folder, as their ratio.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from asyncrlhf.models import load_pretrained, pretrained_policy
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.rollout.vllm import vllm_available
from asyncrlhf.tasks import AdditionTask


def _tokens_per_s(engine: Any, prompts: list[torch.Tensor], samples: int, repeats: int) -> float:
    engine.generate(prompts[:4], samples)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, samples)
        wall = time.perf_counter() - start
        best = max(best, sum(s.response_ids.shape[0] for s in out) / wall)
    return best


def run(prompts: int = 64, samples: int = 8, max_new_tokens: int = 32, repeats: int = 3) -> dict[str, Any]:
    """Throughput of both engines (best of ``repeats``) and the two ways to update vLLM."""
    if not vllm_available():
        return {"skipped": "vLLM is not installed here (bash scripts/setup-vllm.sh makes .venv-vllm)"}
    from asyncrlhf.rollout import VLLMEngine

    path = pretrained_policy()
    model, tokenizer = load_pretrained(path)
    task = AdditionTask(tokenizer, digits=2, seed=0)
    problems = task.train_problems()
    batch = [next(problems).prompt_ids for _ in range(prompts)]
    sampling = Sampling(max_new_tokens=max_new_tokens, temperature=1.0)  # the same distribution for both
    hf = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, sampling=sampling, seed=0)
    vllm = VLLMEngine(str(path), sampling=sampling, seed=0, enforce_eager=True)
    out: dict[str, Any] = {"prompts": prompts, "samples": samples, "max_new_tokens": max_new_tokens}
    out["hf_tokens_per_s"] = _tokens_per_s(hf, batch, samples, repeats)
    out["vllm_tokens_per_s"] = _tokens_per_s(vllm, batch, samples, repeats)
    out["vllm_vs_hf"] = out["vllm_tokens_per_s"] / out["hf_tokens_per_s"]

    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loads = []
    for version in range(1, repeats + 1):
        start = time.perf_counter()
        vllm.load_weights(weights, version)
        loads.append(time.perf_counter() - start)
    out["in_place_load_s"] = min(loads)
    del vllm
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()  # the new weights to a folder, and an engine built on them
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        VLLMEngine(folder, sampling=sampling, seed=0, enforce_eager=True)
        out["full_reload_s"] = time.perf_counter() - start
    out["full_reload_vs_in_place"] = out["full_reload_s"] / out["in_place_load_s"]
    return out
