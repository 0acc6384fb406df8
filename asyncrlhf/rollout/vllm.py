"""Rollout with vLLM (GPU). Imported lazily: ``import asyncrlhf`` never needs vllm.

UNTESTED ON A GPU in this repository until a GPU run verifies it (CI has none). Written
against vLLM's V1 API:

* ``SamplingParams(n=G, temperature, top_p, max_tokens, logprobs=0, seed)`` returns the
  log-prob of each sampled token; ``logprobs_mode="processed_logprobs"`` makes those the
  log-probs of the distribution actually sampled from (after temperature and top-p),
  matching this project's contract, rather than of the raw logits.
* Weights are pushed in place with ``LLM.collective_rpc``, calling each worker's
  ``model_runner.model.load_weights`` on the state dict (tensor parallel size 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from asyncrlhf.models import weights_checksum
from asyncrlhf.rollout.base import EngineBase, Sample, Sampling, check_generate_args

__all__ = ["VLLMEngine", "vllm_available"]


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def _load_weights_rpc(worker: Any, items: list[tuple[str, torch.Tensor]]) -> None:
    worker.model_runner.model.load_weights(weights=items)


class VLLMEngine(EngineBase):
    """vLLM-backed engine with the same protocol as :class:`~asyncrlhf.rollout.HFEngine`.

    Args:
        model_path: a local Hugging Face model directory.
        sampling, seed: sampling settings and the engine's seed.
        version: policy version of the initial weights.
        llm_kwargs: forwarded to ``vllm.LLM`` (``gpu_memory_utilization``, ``dtype``…).

    Raises:
        ImportError: with install instructions, when vllm is not installed.
    """

    def __init__(
        self,
        model_path: str,
        sampling: Sampling = Sampling(),
        seed: int = 0,
        version: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(
                "engine kind 'vllm' needs vLLM on a CUDA machine: pip install vllm "
                "(or use engine kind 'hf', which runs anywhere)"
            ) from err
        self.max_new_tokens = sampling.max_new_tokens
        self._sampling = SamplingParams
        self.temperature, self.top_p, self.seed = sampling.temperature, sampling.top_p, seed
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = LLM(model=str(model_path), seed=seed, **llm_kwargs)
        self._set_version(version)
        self._calls = 0
        self._checksum: str | None = None

    def generate(self, prompts: Sequence[torch.Tensor], num_samples: int = 1) -> list[Sample]:
        check_generate_args(prompts, num_samples)
        params = self._sampling(
            n=num_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_new_tokens,
            logprobs=0,
            seed=self.seed + self._calls,  # reproducible, yet a new draw per call
        )
        self._calls += 1
        requests = [{"prompt_token_ids": p.tolist()} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = []
        for index, (prompt, request) in enumerate(zip(prompts, outputs, strict=True)):
            for completion in request.outputs:
                ids = list(completion.token_ids)
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
                samples.append(
                    Sample(
                        index,
                        prompt,
                        torch.tensor(ids, dtype=torch.long),
                        torch.tensor(logprobs, dtype=torch.float32),
                        self._version,
                    )
                )
        return samples

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        items = list(state_dict.items())
        self.llm.collective_rpc(_load_weights_rpc, args=(items,))
        self.llm.reset_prefix_cache()  # cached KV of the old weights is now wrong
        self._checksum = weights_checksum(state_dict)
        self._set_version(version)

    def checksum(self) -> str:
        """Checksum of the weights last loaded (vLLM shards and fuses them internally,
        so its own parameters are not comparable name by name)."""
        if self._checksum is None:
            raise RuntimeError("no weights loaded through load_weights yet")
        return self._checksum
