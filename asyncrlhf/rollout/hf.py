"""Rollout with a ``transformers`` causal LM on CPU or CUDA.

Batched sampling with a KV cache over left-padded prompts. The engine samples from its
own seeded ``torch.Generator`` (never the global RNG), so a run is reproducible
whatever else draws random numbers. The log-prob recorded for each token is that of
the distribution the token was drawn from: ``softmax(logits / T)``, renormalised over
the top-p nucleus when ``top_p < 1``. The trainer scores tokens with the same
:func:`~asyncrlhf.models.token_logprobs`, so with ``top_p = 1`` and the same weights
the ratio is exactly 1; a nucleus makes the behaviour policy differ from the trained
one, which is real off-policyness and shows up in the ratio statistics.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from asyncrlhf.models import at_least_float32, cache_argument, token_logprobs, weights_checksum
from asyncrlhf.rollout.base import EngineBase, InFlight, Sample, Sampling, check_generate_args
from asyncrlhf.types import pad_rows

__all__ = ["HFEngine"]


class HFEngine(EngineBase):
    """Sampling engine around a Hugging Face causal LM; it can update its weights in
    flight (between decode steps, see :class:`~asyncrlhf.rollout.base.InFlight`).

    Args:
        model: a ``transformers`` causal LM. The engine keeps its own copy (``copy=True``)
            so the trainer's updates reach it only through :meth:`load_weights`.
        eos_token_id: generation stops per row at EOS.
        pad_token_id: fills prompts on the left and finished rows on the right.
        sampling: response cap, temperature (T > 0 samples from softmax(logits / T); 0
            is greedy) and top-p nucleus mass.
        seed: seeds the engine's generator.
        device: where the model runs (default: where it is).
        version: the policy version of the initial weights.
        copy: deep-copy ``model`` (default) instead of sharing it.
        stop: decides from the finished rows (a bool tensor) when decoding stops before
            the cap (default: once they all are); a trainer group evaluating on its
            sharded model passes one that asks every rank, so all make the same passes.
    """

    def __init__(
        self,
        model: Any,
        eos_token_id: int,
        pad_token_id: int,
        sampling: Sampling = Sampling(),
        seed: int = 0,
        device: str | torch.device | None = None,
        version: int = 0,
        copy: bool = True,
        stop: Callable[[torch.Tensor], bool] | None = None,
    ) -> None:
        self.model = (copy_module.deepcopy(model) if copy else model).eval()
        self.stop = stop or _all_finished
        if device is not None:
            self.model.to(device)
        self.device = next(self.model.parameters()).device
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.sampling = sampling
        self.max_new_tokens = sampling.max_new_tokens
        self.temperature = float(sampling.temperature)
        self.top_p = float(sampling.top_p)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._set_version(version)
        self._cache_arg = cache_argument(self.model)

    updates_in_flight = True

    def reseed(self, seed: int) -> None:
        self._generator.manual_seed(seed)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` into the engine's model and record its version."""
        self.model.load_state_dict(state_dict, strict=True)
        self._set_version(version)

    def checksum(self) -> str:
        return weights_checksum(self.model)

    @torch.no_grad()  # not inference_mode: callers may edit or reuse the returned tensors
    def generate(
        self, prompts: Sequence[torch.Tensor], num_samples: int = 1, inflight: InFlight | None = None
    ) -> list[Sample]:
        """Sample ``num_samples`` completions per prompt, prompt-major.

        Each prompt is read once: its KV cache and last logits are repeated for its
        ``num_samples`` rows, which sample independently from there (a group of G costs
        one prefill, not G). A cache without ``batch_repeat_interleave`` falls back to a
        prefill per row. With ``inflight``, weights may change between decode steps
        (see :class:`~asyncrlhf.rollout.base.InFlight`); each token records its version.
        """
        check_generate_args(prompts, num_samples)
        unique = [p.to(self.device) for p in prompts]
        ids = pad_rows(unique, self.pad_token_id, left=True)  # (n, P)
        attention = pad_rows([torch.ones_like(r) for r in unique], 0, left=True)  # (n, P)
        positions = (attention.cumsum(dim=1) - 1).clamp_min(0)
        logits, cache = self._prefill(ids, attention, positions, num_samples)  # (N, V), rows prompt-major
        attention = attention.repeat_interleave(num_samples, dim=0)  # (N, P)
        positions = positions.repeat_interleave(num_samples, dim=0)
        n = attention.shape[0]
        tokens = torch.full((n, self.max_new_tokens), self.pad_token_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros(n, self.max_new_tokens, dtype=torch.float32, device=self.device)
        versions = [self._version]  # the version that sampled each position
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        lengths = torch.zeros(n, dtype=torch.long, device=self.device)

        for t in range(self.max_new_tokens):
            token, logp = self._sample(logits)  # (N,), (N,)
            tokens[:, t] = torch.where(finished, self.pad_token_id, token)
            logprobs[:, t] = torch.where(finished, 0.0, logp)
            lengths += (~finished).long()
            finished |= token == self.eos_token_id
            if t + 1 == self.max_new_tokens or self.stop(finished):  # one sync per token, as HF generate
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            if inflight is not None:
                inflight.before(t + 1)  # may load new weights for the positions from t + 1 on
                versions.append(self._version)
                if inflight.recompute_kv and versions[-1] != versions[-2]:
                    prompt_rows = ids.repeat_interleave(num_samples, dim=0)
                    logits, cache, positions = self._recompute(prompt_rows, tokens[:, : t + 1], attention)
                    continue
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=tokens[:, t : t + 1],
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: cache},
            )
            logits, cache = out.logits[:, -1, :], getattr(out, self._cache_arg)  # (N, V)
        return self._samples(prompts, num_samples, tokens, logprobs, lengths.tolist(), versions)

    def _recompute(
        self, prompt_rows: torch.Tensor, response: torch.Tensor, attention: torch.Tensor
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """The next logits, a KV cache and the last positions, all from the current
        weights: one forward over every row's prompt and response so far."""
        positions = (attention.cumsum(dim=1) - 1).clamp_min(0)
        out = self.model(
            input_ids=torch.cat([prompt_rows, response], dim=1),
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :], getattr(out, self._cache_arg), positions[:, -1:]

    def _samples(
        self,
        prompts: Sequence[torch.Tensor],
        num_samples: int,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: list[int],
        versions: list[int],
    ) -> list[Sample]:
        """One sample per row; with more than one version, each token's (a row's tokens
        from position t on were sampled by ``versions[t]``)."""
        mixed = versions[0] != versions[-1]
        by_position = torch.tensor(versions) if mixed else None
        return [
            Sample(
                prompt_index=i // num_samples,
                prompt_ids=prompts[i // num_samples],
                response_ids=tokens[i, :length].clone(),
                logprobs=logprobs[i, :length].clone(),
                policy_version=versions[0] if by_position is None else int(by_position[:length].min()),
                token_versions=None if by_position is None else by_position[:length].clone(),
            )
            for i, length in enumerate(lengths)
        ]

    def _prefill(
        self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, num_samples: int
    ) -> tuple[torch.Tensor, Any]:
        """The prompts' last logits and KV cache, each repeated ``num_samples`` times."""
        out = self.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache = getattr(out, self._cache_arg)
        if num_samples == 1:
            return out.logits[:, -1, :], cache
        if hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(num_samples)
            return out.logits[:, -1, :].repeat_interleave(num_samples, dim=0), cache
        rows = (ids.repeat_interleave(num_samples, dim=0), attention.repeat_interleave(num_samples, dim=0))
        out = self.model(
            input_ids=rows[0],
            attention_mask=rows[1],
            use_cache=True,
            logits_to_keep=1,
            position_ids=positions.repeat_interleave(num_samples, dim=0),
        )
        return out.logits[:, -1, :], getattr(out, self._cache_arg)

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.temperature == 0:
            token = logits.argmax(dim=-1)
            return token, token_logprobs(logits, token, 1.0)
        scaled = at_least_float32(logits) / self.temperature  # (N, V)
        if self.top_p < 1.0:
            scaled = _nucleus(scaled, self.top_p)
        probs = torch.softmax(scaled, dim=-1)
        token = torch.multinomial(probs, 1, generator=self._generator).squeeze(1)  # (N,)
        # Scored on the (possibly truncated) distribution actually sampled from.
        return token, token_logprobs(scaled, token, 1.0)


def _all_finished(finished: torch.Tensor) -> bool:
    return bool(finished.all())


def _nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask logits outside the smallest set whose probability mass reaches ``top_p``."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # keeps at least the top token
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))
