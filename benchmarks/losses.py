"""Loss benchmark: forward + backward time of M2PO (batch rule) and GRPO relative to PPO.

    python -m benchmarks.losses --tokens 1048576

All three losses run on the same (B, L) log-probs with a quarter of the tokens masked,
timed in interleaved rounds; the figures are time ratios to PPO.
"""

from __future__ import annotations

import argparse
import sys

import torch

from asyncrlhf.losses import compute_grpo_loss, compute_m2po_loss, compute_ppo_loss
from benchmarks._timing import measure_interleaved


def run(tokens: int = 1 << 20, length: int = 1024, repeats: int = 10, device: str = "cpu") -> dict[str, float]:
    dev = torch.device(device)
    batch = max(1, tokens // length)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(batch, length, generator=g) * 0.1 - 1.0).to(dev)
    old = (logits + torch.randn(batch, length, generator=g) * 0.2).to(dev)  # stale behaviour policy
    advantages = torch.randn(batch, generator=g).to(dev)
    mask = (torch.rand(batch, length, generator=g) > 0.25).to(dev)

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
            "grpo": step(compute_grpo_loss),
        },
        dev,
        repeats,
    )
    return {
        "ppo_ms": times["ppo"].median * 1e3,
        "m2po_vs_ppo": times["m2po"].median / times["ppo"].median,
        "grpo_vs_ppo": times["grpo"].median / times["ppo"].median,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    result = run(args.tokens, repeats=args.repeats, device=args.device)
    print(f"losses at {args.tokens} tokens: PPO {result['ppo_ms']:.1f} ms forward+backward; "
          f"M2PO {result['m2po_vs_ppo']:.2f}× PPO, GRPO {result['grpo_vs_ppo']:.2f}× PPO")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
