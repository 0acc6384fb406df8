"""The trainer: one policy-gradient step on a batch of experiences.

Phases: setup (model, optimiser, loss) → step (collate, recompute log-probs, loss,
AdamW with gradient clipping over mini-batches and epochs, bump the version) →
save / load (model, optimiser, version, every RNG state, so a resumed run continues
exactly as an uninterrupted one would).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrlhf.losses import aggregation_share, policy_loss
from asyncrlhf.models import PIECE_BYTES, state_buckets, weights_checksum
from asyncrlhf.training.logprobs import sequence_logprobs
from asyncrlhf.training.lora import adapter_state_dict, is_lora, load_adapter_state, merged_state_dict
from asyncrlhf.training.optim import LrDecay, OptimConfig
from asyncrlhf.types import Experience, ExperienceBatch, collate

__all__ = ["LrDecay", "OptimConfig", "TrainerWorker", "sequence_logprobs"]


class TrainerWorker:
    """Optimises a causal LM with PPO, M2PO or GRPO on experiences from any buffer.

    Args:
        model: the policy (a ``transformers`` causal LM), trained in place.
        pad_token_id: padding id for collation.
        algorithm: a registered policy loss (``"ppo"``, ``"m2po"``, ``"grpo"``…).
        loss_options: options of the chosen loss (see :func:`~asyncrlhf.losses.policy_loss`).
        optim: AdamW settings, gradient clipping, epochs and mini-batches per batch.
        temperature: sampling temperature of the engines; log-probs are recomputed at it.
        ref_model: frozen reference for the KL term (GRPO's ``kl_coef``).
        versions: optional shared version source with ``bump()``, bumped once per step.
        device: where to train (default: where the model is).
        seed: seeds the mini-batch shuffling generator.
        skip_zero_advantage: leave rows whose advantage is 0 out of the forward and
            backward pass when the loss allows it (``BoundLoss.skips_zero_advantage``):
            they add exactly nothing to the gradient, and the loss over the rest is
            rescaled by their share, so the update is the same up to float rounding at a
            fraction of the cost (GRPO groups whose completions all scored alike). The
            ``policy/*`` statistics are then those of the rows trained on;
            ``train/signal_rows`` is their share of the batch.
        share_prompts: read each distinct prompt once per pass (see
            :func:`sequence_logprobs`); False reads every row whole.
    """

    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        algorithm: str = "grpo",
        loss_options: dict[str, Any] | None = None,
        optim: OptimConfig = OptimConfig(),
        temperature: float = 1.0,
        ref_model: Any | None = None,
        versions: Any | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        skip_zero_advantage: bool = True,
        share_prompts: bool = True,
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for training, got {temperature!r}")
        self.model = model.to(device) if device is not None else model
        self.device = next(self.model.parameters()).device
        self.pad_token_id = pad_token_id
        self.loss_fn = policy_loss(algorithm, **(loss_options or {}))
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters
        self.optimizer = torch.optim.AdamW(trainable, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
        self.grad_clip, self.optim = optim.grad_clip, optim
        self.temperature = temperature
        self.ppo_epochs, self.mini_batches = optim.ppo_epochs, optim.mini_batches
        self.ref_model = ref_model.to(self.device).eval().requires_grad_(False) if ref_model is not None else None
        self.versions = versions
        self.version = 0 if versions is None else int(versions.version)
        self.skipped_steps = 0
        self.skip_zero_advantage = skip_zero_advantage and self.loss_fn.skips_zero_advantage
        self.share_prompts = share_prompts
        self._generator = torch.Generator().manual_seed(seed)
        self._gap: dict[str, float] | None = None

    # ------------------------------------------------------------------ step
    def step(self, experiences: Sequence[Experience]) -> dict[str, float]:
        """One training step; returns metrics in the shared vocabulary."""
        batch = collate(experiences, self.pad_token_id, self.device)
        if torch.isnan(batch.advantages).any():
            raise ValueError("every experience needs an advantage (use a GroupAwareReplayBuffer or set them)")
        if len(batch) < self.mini_batches:
            raise ValueError(f"batch of {len(batch)} experiences cannot split into mini_batches={self.mini_batches}")
        ref_logprobs = prox_logprobs = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logprobs = self._logprobs(self.ref_model, batch)
        if self.loss_fn.uses_proximal:  # the policy before this step's updates (decoupled PPO)
            with torch.no_grad():
                prox_logprobs = self._logprobs(self.model, batch)

        self._gap: dict[str, float] | None = None  # filled by the step's first log-prob pass
        self.model.train()
        totals: dict[str, float] = {}
        updates = skipped = 0
        for _ in range(self.ppo_epochs):
            order = torch.randperm(len(batch), generator=self._generator) if self.mini_batches > 1 else None
            for rows in self._split(order):
                metrics = self._update(batch, rows, ref_logprobs, prox_logprobs)
                if metrics is None:
                    skipped += 1
                    continue
                updates += 1
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
        self.model.eval()
        self.skipped_steps += int(updates == 0)
        self.version += 1
        if self.versions is not None:
            self.versions.bump()
        out = {key: value / updates for key, value in totals.items()} if updates else {}
        out.update(self._gap or {})
        out["train/signal_rows"] = float((batch.advantages != 0).float().mean())
        out["train/skipped_updates"] = float(skipped)
        out["train/skipped_steps"] = float(self.skipped_steps)
        return out

    def _updates_done(self) -> int:
        """Optimiser updates taken so far: AdamW's own count, which a checkpoint keeps. The
        largest over parameters: a frozen (or unused) one has no count, or a lower one."""
        return max((int(state["step"]) for state in self.optimizer.state.values()), default=0)

    def _split(self, order: torch.Tensor | None) -> list[torch.Tensor | None]:
        if order is None:
            return [None]
        return list(torch.tensor_split(order, self.mini_batches))

    def _update(
        self,
        batch: ExperienceBatch,
        rows: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        prox_logprobs: torch.Tensor | None = None,
    ) -> dict[str, float] | None:
        """One optimiser update on ``rows`` of the batch; None when skipped as non-finite."""
        sub, ref, prox = batch, ref_logprobs, prox_logprobs
        if rows is not None:
            sub, ref, prox = _take(sub, ref, prox, rows.to(self.device))
        signal, share = self._signal_rows(sub)
        if signal is not None:
            sub, ref, prox = _take(sub, ref, prox, signal)
        micro = self.optim.micro_batch_size
        self.optimizer.zero_grad(set_to_none=True)
        if micro is not None and micro < len(sub):
            loss, metrics = self._accumulate(sub, ref, prox, share, micro)
        else:
            logprobs = self._logprobs(self.model, sub)  # (b, R)
            self._note_gap(sub, logprobs)
            loss, metrics = self.loss_fn(logprobs, sub.old_logprobs, sub.advantages, sub.response_mask, ref, prox)
            loss = loss * share
            if torch.isfinite(loss):
                self._backward(loss)
        if not torch.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        # With an infinite max norm clipping only measures: one call serves both.
        grad_norm = self._clip_grads(self.grad_clip if self.grad_clip is not None else math.inf)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        lr = self.optim.lr_at(self._updates_done())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        out = {f"policy/{k}": v for k, v in metrics.items() if k != "kl"}
        out["loss/policy"] = float(loss.detach())
        out["loss/kl"] = metrics.get("kl", 0.0)
        out["train/grad_norm"] = grad_norm
        out["train/lr"] = lr
        return out

    def _accumulate(
        self,
        sub: ExperienceBatch,
        ref: torch.Tensor | None,
        prox: torch.Tensor | None,
        share: float,
        micro: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The mini-batch's gradient, ``micro`` rows at a time. A pass without a graph
        gives every row's log-probs; then each micro-batch's rows are computed again with
        their graph, put in place of their values, and the loss over the whole mini-batch
        taken and back-propagated: the other rows are constants at their true values, so
        the micro-batches' gradients sum to the mini-batch's, whatever the loss's
        aggregation or batch-wide statistics (M2PO's mask, the trust region's budget).
        One forward more per mini-batch; activations of one micro-batch at a time."""
        chunks = list(torch.arange(len(sub), device=self.device).split(micro))
        with torch.no_grad():
            full = torch.cat([self._logprobs(self.model, _select(sub, rows)) for rows in chunks])
            self._note_gap(sub, full)
            loss, metrics = self.loss_fn(full, sub.old_logprobs, sub.advantages, sub.response_mask, ref, prox)
        loss = loss * share
        if not torch.isfinite(loss):
            return loss, metrics
        for rows in chunks:
            mixed = full.index_put((rows,), self._logprobs(self.model, _select(sub, rows)))
            part, _ = self.loss_fn(mixed, sub.old_logprobs, sub.advantages, sub.response_mask, ref, prox)
            self._backward(part * share)
        return loss, metrics

    def _note_gap(self, sub: ExperienceBatch, logprobs: torch.Tensor) -> None:
        """``rollout/logprob_gap``: mean |engine − trainer| log-prob over the tokens the
        trainer's current weights sampled (their version is the trainer's), from the
        step's first pass, before any update: what the engine computes differently from
        the trainer (dtype, kernels, a failed weight load), policy drift excluded.
        Absent from a step with no such token (every token stale)."""
        if self._gap is not None:
            return
        fresh = sub.response_mask & (sub.token_versions == self.version)  # (b, R)
        self._gap = {}
        if bool(fresh.any()):
            gap = (logprobs.detach() - sub.old_logprobs).abs()[fresh]
            self._gap = {"rollout/logprob_gap": float(gap.mean()), "rollout/logprob_gap_max": float(gap.max())}

    # ------------------------------------------- what a sharded trainer changes
    def _logprobs(self, model: Any, batch: ExperienceBatch) -> torch.Tensor:
        """Log-probs of ``batch``'s response tokens under ``model``: Tensor[B, R]."""
        return sequence_logprobs(model, batch, self.temperature, self.share_prompts)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _clip_grads(self, max_norm: float) -> float:
        """Clip the gradient's global norm at ``max_norm``; the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

    def inference_model(self) -> Any:
        """The live policy, to generate with (the held-out evaluation): here the whole
        model; a trainer group's is sharded, and every rank generates with it together."""
        return self.model

    def generation_stop(self) -> Callable[[torch.Tensor], bool] | None:
        """When generation with :meth:`inference_model` stops, given this process's
        finished rows: None (when they all are); a group's asks every rank."""
        return None

    def _signal_rows(self, batch: ExperienceBatch) -> tuple[torch.Tensor | None, float]:
        """The rows with a non-zero advantage and their share of the loss (see
        :func:`~asyncrlhf.losses.aggregation_share`); ``(None, 1.0)``, every row,
        when skipping is off or would drop nothing or everything (an all-zero batch
        still takes its optimiser step, as AdamW's momentum moves the weights)."""
        if not self.skip_zero_advantage:
            return None, 1.0
        rows = (batch.advantages != 0).nonzero().squeeze(1)
        if rows.numel() in (0, len(batch)):
            return None, 1.0
        return rows, aggregation_share(batch.response_mask.float(), rows, self.loss_fn.loss_agg)

    # ----------------------------------------------------------- weights / io
    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the model weights, for publishing to rollout engines (with
        LoRA: the base model's, adapters merged)."""
        if is_lora(self.model):
            return merged_state_dict(self.model)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def stream_state(self, bucket_bytes: int = PIECE_BYTES) -> Iterator[dict[str, torch.Tensor]]:
        """The published weights (those of :meth:`state_dict`) in key order, in pieces of
        about ``bucket_bytes`` (a larger tensor is a piece of its own), so a publication
        can hand each on (``ray.put``) before the next is made. Here the live tensors,
        detached (no copy: the consumer copies them before the next step); a trainer
        group gathers each piece on rank 0 (see :class:`~asyncrlhf.training.sharded.ShardedTrainer`)."""
        state = merged_state_dict(self.model) if is_lora(self.model) else self.model.state_dict()
        yield from state_buckets(((k, state[k].detach()) for k in sorted(state)), bucket_bytes)

    def checksum(self) -> str:
        return weights_checksum(self.state_dict() if is_lora(self.model) else self.model)

    def adapter(self) -> dict[str, Any] | None:
        """With LoRA: ``{"config": the peft config as a dict, "weights": the adapter's}``."""
        if not is_lora(self.model):
            return None
        return {"config": self.model.peft_config["default"].to_dict(), "weights": adapter_state_dict(self.model)}

    def weights_layout(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """The published weights' names, shapes and dtypes, in order (no copy, no collective)."""
        state = self.state_dict() if is_lora(self.model) else self.model.state_dict()
        return [(k, tuple(v.shape), v.dtype) for k, v in state.items()]

    def state(self) -> dict[str, Any]:
        """Model, optimiser, version and every RNG state: plain values and tensors only,
        so ``torch.load(..., weights_only=True)`` reads it back."""
        name, keys, pos, has_gauss, cached = np.random.get_state()
        return {
            "model": adapter_state_dict(self.model) if is_lora(self.model) else self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "skipped_steps": self.skipped_steps,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python": random.getstate(),
                "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
                "trainer": self._generator.get_state(),
            },
        }

    def save(self, path: str | Path) -> None:
        """Checkpoint :meth:`state` to ``path``."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state(), path)

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote; the shared version source follows."""
        self.restore(torch.load(path, map_location=self.device, weights_only=True))

    def restore(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`; the shared version source follows."""
        if is_lora(self.model):  # the adapters alone; the frozen base is the spec's model
            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._restore_progress(state)

    def _restore_progress(self, state: dict[str, Any]) -> None:
        """Version, counters and every RNG state of :meth:`state`."""
        self.version = int(state["version"])
        self.skipped_steps = int(state["skipped_steps"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
        python = rng["python"]
        random.setstate((python[0], tuple(python[1]), python[2]))
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        self._generator.set_state(rng["trainer"].cpu())
        if self.versions is not None:
            self.versions.restore(self.version)


def _take(
    batch: ExperienceBatch, ref: torch.Tensor | None, prox: torch.Tensor | None, rows: torch.Tensor
) -> tuple[ExperienceBatch, torch.Tensor | None, torch.Tensor | None]:
    """``rows`` of the batch and of the log-probs that go with it."""
    return _select(batch, rows), None if ref is None else ref[rows], None if prox is None else prox[rows]


def _select(batch: ExperienceBatch, rows: torch.Tensor) -> ExperienceBatch:
    return ExperienceBatch(
        input_ids=batch.input_ids[rows],
        attention_mask=batch.attention_mask[rows],
        position_ids=batch.position_ids[rows],
        response_mask=batch.response_mask[rows],
        response_ids=batch.response_ids[rows],
        old_logprobs=batch.old_logprobs[rows],
        rewards=batch.rewards[rows],
        advantages=batch.advantages[rows],
        policy_versions=batch.policy_versions[rows],
        token_versions=batch.token_versions[rows],
        prompt_width=batch.prompt_width,
    )
