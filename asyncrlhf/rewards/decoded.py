"""Decoded rewards that cannot hang the run: decode once per batch, score every row in a
process pool with a per-row timeout.

A Python verifier can take unbounded time on one pathological response (sympy on a
huge expression), or raise, or crash its process. Scored in the trainer's process with
no timeout, one such row stalls the whole run. Here each row is a task in a
:class:`pebble.ProcessPool`; a row over ``timeout_s`` has its worker killed (the pool
starts a new one) and scores ``timeout_score``; a row that raises, or whose worker
dies, scores ``error_score``. Both are counted per row and reach the trainer's metrics
as ``reward/timeouts`` and ``reward/errors``; the run goes on.

``workers=0`` scores in this process (no timeout can be enforced): the baseline the
reward benchmark measures the pool against.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.rewards._tokens import check_generated_ids

__all__ = ["FLAGS", "DecodedReward", "resolve_scorer"]

ScoreFn = Callable[[str, str], float]
FLAGS = ("timeouts", "errors")  # per-row counts a decoded reward reports, as reward/<flag>
DEFAULT_SCORER = "asyncrlhf.rewards.verify:math_score"


def resolve_scorer(path: str) -> ScoreFn:
    """``"package.module:function"`` (or dotted) to the function; a ValueError naming
    the path if it cannot be imported or is not callable."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as err:
        raise ValueError(f"scorer {path!r} could not be loaded: {type(err).__name__}: {err}") from None
    if not callable(fn):
        raise ValueError(f"scorer {path!r} is a {type(fn).__name__}, not a function")
    return fn


class DecodedReward:
    """A reward function ``(generated_ids, answers, eos_token_id) -> (scores, flags)``
    that decodes responses (cut at EOS) and references once per batch and scores each
    pair with ``scorer(response, reference) -> float``.

    Args:
        tokenizer: decodes responses and token-id answers.
        scorer: the scoring function, or its import path (``"pkg.mod:fn"``); it must be
            importable by path to run in the pool. Default: the math verifier.
        workers: pool processes (0: score in this process, no timeout).
        timeout_s: per-row time limit in the pool.
        timeout_score, error_score: the score of a row that timed out, or raised.

    The pool starts on first use in the process that scores (a Ray actor builds its
    own); it is not pickled. :meth:`close` stops it; so do interpreter exit and an
    interrupt while a batch is scored.
    """

    def __init__(
        self,
        tokenizer: Any,
        scorer: str | ScoreFn = DEFAULT_SCORER,
        workers: int = 2,
        timeout_s: float = 5.0,
        timeout_score: float = 0.0,
        error_score: float = 0.0,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.tokenizer = tokenizer
        self.scorer = resolve_scorer(scorer) if isinstance(scorer, str) else scorer
        self.workers = check_nonnegative_int("workers", workers)
        self.timeout_s, self.timeout_score, self.error_score = (
            float(timeout_s),
            float(timeout_score),
            float(error_score),
        )
        self._pool: Any = None
        self._lock = threading.Lock()  # rollout and evaluation may score from two threads

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = state["_lock"] = None  # each process starts its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scoring
    def decode(self, generated_ids: torch.Tensor, answers: Sequence[Any], eos_token_id: int) -> tuple[list, list]:
        """Responses (cut at the first EOS) and references as text, one transfer and one
        ``batch_decode`` each."""
        ids = check_generated_ids(generated_ids)
        if len(answers) != ids.shape[0]:
            raise ValueError(f"answers has {len(answers)} items but generated_ids has {ids.shape[0]} rows")
        rows = [row[: row.index(eos_token_id)] if eos_token_id in row else row for row in ids.tolist()]
        responses = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        token_answers = [i for i, a in enumerate(answers) if isinstance(a, torch.Tensor)]
        # none to decode: no call (transformers < 5.20 decodes an empty list to [''])
        tokens = [answers[i].tolist() for i in token_answers]
        decoded = self.tokenizer.batch_decode(tokens, skip_special_tokens=True) if tokens else []
        references = list(answers)
        for i, text in zip(token_answers, decoded, strict=True):
            references[i] = text
        return responses, references

    def __call__(
        self, generated_ids: torch.Tensor, answers: Sequence[Any], eos_token_id: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        responses, references = self.decode(generated_ids, answers, eos_token_id)
        scores, status = self.score(responses, references)
        device = generated_ids.device
        flags = {flag: torch.tensor([s == flag for s in status], dtype=torch.float32, device=device) for flag in FLAGS}
        return torch.tensor(scores, dtype=torch.float32, device=device), flags

    def score(self, responses: Sequence[str], references: Sequence[str]) -> tuple[list[float], list[str]]:
        """Each pair's score and status (``"ok"``, ``"timeouts"`` or ``"errors"``)."""
        if self.workers == 0:
            return self._score_here(responses, references)
        pool = self._ensure_pool()
        futures = [
            pool.schedule(self.scorer, args=(r, ref), timeout=self.timeout_s)
            for r, ref in zip(responses, references, strict=True)
        ]
        scores, status = [], []
        try:
            for future in futures:
                try:
                    scores.append(float(future.result()))
                    status.append("ok")
                except FutureTimeout:
                    scores.append(self.timeout_score)
                    status.append("timeouts")
                except Exception:  # raised, returned a non-number, or its worker died
                    scores.append(self.error_score)
                    status.append("errors")
        except BaseException:  # an interrupt: no worker outlives it
            self.close()
            _kill_stray_workers()
            raise
        return scores, status

    def _score_here(self, responses: Sequence[str], references: Sequence[str]) -> tuple[list[float], list[str]]:
        scores, status = [], []
        for response, reference in zip(responses, references, strict=True):
            try:
                scores.append(float(self.scorer(response, reference)))
                status.append("ok")
            except Exception:
                scores.append(self.error_score)
                status.append("errors")
        return scores, status

    # ------------------------------------------------------------------ the pool
    def _ensure_pool(self) -> Any:
        with self._lock:
            return self._pool or self._start_pool()

    def _start_pool(self) -> Any:
        from pebble import ProcessPool

        # Workers fork from a single-threaded server, not from this process (whose torch
        # and Ray threads a fork would copy mid-operation). The server imports pebble and
        # the scorer's module once, so a worker replacing a killed one starts at once
        # (else each imports the scorer's module, and torch with it: ~0.7 s).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["pebble", self.scorer.__module__])
        self._pool = ProcessPool(max_workers=self.workers, context=context)
        atexit.register(_stop, weakref.ref(self))
        return self._pool

    def close(self) -> None:
        """Stop the pool's workers (running rows are killed) and wait for them."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            # pebble's join ignores its timeout once the pool is stopped (it joins its own
            # threads without one): joined from a daemon thread, waited for at most 10 s.
            joiner = threading.Thread(target=pool.join, name="decoded-pool-join", daemon=True)
            joiner.start()
            joiner.join(timeout=10)

    def __enter__(self) -> DecodedReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(ref: weakref.ref) -> None:
    reward = ref()
    if reward is not None:
        reward.close()
    _kill_stray_workers()  # at exit: none may hold it


def _kill_stray_workers() -> None:
    """Kill every pool worker of this process that outlived its pool's stop, on the way
    down (an interrupt, or exit). pebble starts them as non-daemon processes, which
    multiprocessing joins at exit: one the stop missed (being replaced just then) held a
    Ctrl-C'd process for its row's whole timeout (seen once in a CI run: the SIGINT
    test's 72 s wait expired on an idle machine)."""
    for child in multiprocessing.active_children():
        if child.name.startswith("pebble_pool_worker"):
            child.kill()
            child.join(timeout=5)
