"""Loss benchmark: forward + backward time of M2PO (each mode) and GRPO relative to PPO.

    asyncrlhf bench --suite full --case losses     # 2^20 tokens on the CPU

Every loss runs on the same (B, L) log-probs with a quarter of the tokens masked, timed
in interleaved rounds; the figures are time ratios to PPO (``m2po_vs_ppo`` is the batch
rule, the other modes are named).
"""

from __future__ import annotations

import torch

from asyncrlhf.losses import compute_grpo_loss, compute_m2po_loss, compute_ppo_loss
from pipelines.bench._timing import measure_interleaved


def run(tokens: int = 1 << 20, length: int = 1024, repeats: int = 10, device: str = "cpu") -> dict[str, float]:
    dev = torch.device(device)
    batch = max(1, tokens // length)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, length, generator=g) * 0.1 - 1.0  # made on the CPU (the generator's), then moved
    old = logits + torch.randn(batch, length, generator=g) * 0.2  # stale behaviour policy
    advantages = torch.randn(batch, generator=g)
    mask = torch.rand(batch, length, generator=g) > 0.25
    logits, old, advantages, mask = (t.to(dev) for t in (logits, old, advantages, mask))

    def step(loss_fn, **kwargs):  # type: ignore[no-untyped-def]
        def go() -> None:
            logprobs = logits.clone().requires_grad_(True)
            loss, _ = loss_fn(logprobs, old, advantages, mask, **kwargs)
            loss.backward()

        return go

    times = measure_interleaved(
        {
            "ppo": step(compute_ppo_loss),
            "m2po": step(compute_m2po_loss, m2_threshold=0.04, mode="batch"),
            "m2po_trust_region": step(compute_m2po_loss, m2_threshold=0.04, mode="trust_region"),
            "m2po_token": step(compute_m2po_loss, m2_threshold=4.0, mode="token"),
            "grpo": step(compute_grpo_loss),
        },
        dev,
        repeats,
    )
    return {
        "ppo_ms": times["ppo"].median * 1e3,
        # ratios of the least disturbed rounds (see measure_interleaved)
        "m2po_vs_ppo": times["m2po"].min / times["ppo"].min,
        "m2po_trust_region_vs_ppo": times["m2po_trust_region"].min / times["ppo"].min,
        "m2po_token_vs_ppo": times["m2po_token"].min / times["ppo"].min,
        "grpo_vs_ppo": times["grpo"].min / times["ppo"].min,
    }
