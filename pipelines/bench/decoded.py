"""Decoded-reward benchmark: the process pool against the in-process loop, and the
tensor-native reward against the decoded one, on the same batch.

    asyncrlhf bench --suite quick --case decoded

Two verifier costs: *numeric* (GSM8K-style ``#### 42``: an exact rational compare, a
few microseconds a row) and *symbolic* (answers like ``\\boxed{(x+1)^2}`` against
``x^2+2x+1``: sympy, milliseconds a row). The pool pays a per-row round trip to a worker
for its timeout guarantee; the figures say where that costs and where the workers earn
it back. All methods must agree row for row.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from asyncrlhf.models import build_char_tokenizer
from asyncrlhf.rewards import DecodedReward, exact_match_reward

EOS = 2


def make_batch(batch: int, symbolic: bool, seed: int = 0) -> tuple[list[str], list[str]]:
    """Responses with worked text and a final answer; about half are correct."""
    rng = random.Random(seed)
    responses, references = [], []
    for _ in range(batch):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if symbolic:
            reference = f"x^2+{2 * a}*x+{a * a}"
            answer = f"(x+{a})^2" if rng.random() < 0.5 else f"(x+{a + 1})^2"
            responses.append(f"Expand and collect the terms: \\boxed{{{answer}}}")
        else:
            reference = str(a + b)
            answer = a + b if rng.random() < 0.5 else a + b + 1
            responses.append(f"{a} plus {b} makes {answer}.\n#### {answer}")
        references.append(reference)
    return responses, references


def _rate(fn: Any, rows: int, repeats: int) -> float:
    """Rows per second, the median of ``repeats`` timed calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return rows / sorted(times)[len(times) // 2]


def run(batch: int = 256, workers: tuple[int, ...] = (1, 2, 4), repeats: int = 3) -> dict[str, Any]:
    """Samples per second of each method; ratios against the in-process loop."""
    tokenizer = build_char_tokenizer()
    out: dict[str, Any] = {"batch": batch, "rates": {}, "ratios": {}}
    for kind in ("numeric", "symbolic"):
        responses, references = make_batch(batch, symbolic=kind == "symbolic")
        loop = DecodedReward(tokenizer, workers=0)
        expected, _ = loop.score(responses, references)
        rates = {"loop": _rate(lambda: loop.score(responses, references), batch, repeats)}  # noqa: B023
        for n in workers:
            with DecodedReward(tokenizer, workers=n, timeout_s=30.0) as pool:
                scores, status = pool.score(responses, references)
                if scores != expected or set(status) != {"ok"}:
                    raise AssertionError(f"the {n}-worker pool disagrees with the loop on {kind} answers")
                rates[f"pool{n}"] = _rate(lambda: pool.score(responses, references), batch, repeats)  # noqa: B023
        out["rates"][kind] = rates
        out["ratios"].update({f"{kind}.pool{n}_vs_loop": rates[f"pool{n}"] / rates["loop"] for n in workers})
    out["ratios"]["tensor_vs_decoded"] = _tensor_vs_decoded(tokenizer, batch, repeats)
    return out


def _tensor_vs_decoded(tokenizer: Any, batch: int, repeats: int) -> float:
    """Exact match on token ids against decode + verify in process, same numeric batch."""
    responses, references = make_batch(batch, symbolic=False)
    answers = [r.rsplit("#### ", 1)[1] for r in responses]  # the tensor reward sees the answer tokens
    rows = [[*tokenizer.encode(a, add_special_tokens=False), EOS] for a in answers]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    refs = [torch.tensor(tokenizer.encode(r, add_special_tokens=False)) for r in references]
    decoded = DecodedReward(tokenizer, workers=0)
    tensor, (text, _) = exact_match_reward(ids, refs, EOS), decoded(ids, refs, EOS)
    if not torch.equal(tensor.float(), text):
        raise AssertionError("exact_match and the decoded verifier disagree")
    tensor_rate = _rate(lambda: exact_match_reward(ids, refs, EOS), batch, repeats * 10)
    return tensor_rate / _rate(lambda: decoded(ids, refs, EOS), batch, repeats * 10)
