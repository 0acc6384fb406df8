"""Decoded rewards: the math verifier, and a process pool in which a hanging or raising
verifier costs one row its score (counted), never the run; the pool ends with its owner."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from asyncrlhf.models import build_char_tokenizer
from asyncrlhf.rewards import CompositeReward, DecodedReward, RewardTerm
from asyncrlhf.rewards.verify import extract_answer, math_equal, math_score
from tests.helpers import patience
from tests.pipelines.conftest import REPO, env

EOS = 2


@pytest.mark.parametrize(
    ("response", "reference", "score"),
    [
        ("so 3 + 4 = 7\n#### 7", "7", 1.0),
        ("#### 7.0", "7", 1.0),
        ("#### $1,234", "1234", 1.0),
        ("#### 84/2", "42", 1.0),
        ("the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{x + 1}", "1 + x", 1.0),
        ("#### 2^3", "8", 1.0),
        ("first 12, then 13", "13", 1.0),  # the last number
        ("first 13, then 12", "13", 0.0),
        ("no number at all", "3", 0.0),
        ("#### 41", "she has 6 + 35 = 41 apples\n#### 41", 1.0),  # a worked reference: its final answer
        ("#### 5", "-5", 0.0),
    ],
)
def test_the_math_verifier(response, reference, score):
    assert math_score(response, reference) == score


def test_extraction_prefers_hashes_then_boxed_then_the_last_number():
    assert extract_answer("7 and \\boxed{8}\n#### 9") == "9"
    assert extract_answer("7 and \\boxed{\\frac{8}{2}} and 3") == "\\frac{8}{2}"
    assert extract_answer("7 and 3.5.") == "3.5"
    assert extract_answer("nothing") is None
    assert not math_equal("1/0", "1") and not math_equal("x+", "1")


def batch(tokenizer, texts: list[str]) -> torch.Tensor:
    rows = [[*tokenizer.encode(t, add_special_tokens=False), EOS] for t in texts]
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def test_a_hanging_and_a_raising_row_score_their_values_and_are_counted():
    tokenizer = build_char_tokenizer()
    texts = ["#### 7", "hang", "boom", "#### 8"]
    answers = [torch.tensor(tokenizer.encode(a, add_special_tokens=False)) for a in ["7", "7", "7", "7"]]
    with DecodedReward(
        tokenizer, "tests.rewards.scorers:unruly", workers=2, timeout_s=1.0, timeout_score=-1.0, error_score=-2.0
    ) as reward:
        begin = time.monotonic()
        scores, flags = reward(batch(tokenizer, texts), answers, EOS)
        assert time.monotonic() - begin < 30  # the hanging row was cut off, not waited for
        assert scores.tolist() == [1.0, -1.0, -2.0, 0.0]
        assert flags["timeouts"].tolist() == [0, 1, 0, 0] and flags["errors"].tolist() == [0, 0, 1, 0]
        again, _ = reward(batch(tokenizer, ["#### 7"] * 4), answers, EOS)  # the killed worker was replaced
        assert again.tolist() == [1.0] * 4
    here = DecodedReward(tokenizer, "tests.rewards.scorers:unruly", workers=0)  # in-process: no pool
    scores, flags = here(batch(tokenizer, ["boom", "#### 7"]), answers[:2], EOS)
    assert scores.tolist() == [0.0, 1.0] and flags["errors"].tolist() == [1, 0]


def test_a_composite_reward_carries_the_flags_of_its_decoded_term():
    tokenizer = build_char_tokenizer()
    decoded = DecodedReward(tokenizer, "tests.rewards.scorers:unruly", workers=0)
    reward = CompositeReward([RewardTerm("decoded", 1.0, fn=decoded), RewardTerm("terminated", 0.5)])
    answers = [torch.tensor(tokenizer.encode("7", add_special_tokens=False))] * 2
    total, flags = reward(batch(tokenizer, ["#### 7", "boom"]), answers, EOS)
    assert total.tolist() == [1.5, 0.5] and flags["errors"].tolist() == [0, 1]
    assert not isinstance(CompositeReward([RewardTerm("terminated")])(batch(tokenizer, ["7"]), answers[:1], EOS), tuple)


SCRIPT = """
import json, os, signal, sys, psutil, torch
from asyncrlhf.models import build_char_tokenizer
from asyncrlhf.rewards import DecodedReward
tok = build_char_tokenizer()
reward = DecodedReward(tok, "tests.rewards.scorers:unruly", workers=2, timeout_s=600)
ids = lambda text: torch.tensor([tok.encode(text, add_special_tokens=False) + [2]])
answer = [torch.tensor(tok.encode("7", add_special_tokens=False))]
reward(ids("#### 7"), answer, 2)  # the pool is up
print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
if sys.argv[1] == "hang":
    print("scoring", flush=True)
    reward(ids("hang"), answer, 2)  # interrupted here
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _default_sigint() -> None:
    """In the child, before Python starts: SIGINT's default disposition. A child inherits
    an ignored SIGINT, and Python then installs no KeyboardInterrupt handler; something
    earlier in a full suite leaves the test process ignoring it (with it ignored here, the
    Ctrl-C'd child waited out the 60 s, as it did in every full suite run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("ending", ["exit", "hang"])
def test_the_pool_ends_with_its_process_on_exit_and_on_ctrl_c(ending, tmp_path):
    # stderr goes to a file and the test waits on the process itself: the pool's fork
    # server and workers inherit the child's pipes, so reading them to EOF (communicate)
    # waited on the grandchildren too, and timed out although the child had exited; the
    # grandchildren are checked below, on their own.
    with (tmp_path / "stderr").open("w+") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, ending],
            cwd=REPO,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=_default_sigint,
        )
        children = json.loads(process.stdout.readline())
        assert len(children) >= 2  # the workers (and the fork server)
        if ending == "hang":
            assert process.stdout.readline().strip() == "scoring"
            time.sleep(1.0)  # inside the hanging row
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=patience(60))
        except subprocess.TimeoutExpired:  # say how the child stood with signals, for the open case
            status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
            process.kill()
            err.seek(0)
            signals = [line for line in status if line.startswith(("State", "Sig", "Shd"))]
            raise AssertionError(f"the child did not exit: {signals}; stderr: {err.read()[-2000:]}") from None
        process.stdout.close()
        err.seek(0)
        stderr = err.read()
    # An uncaught KeyboardInterrupt ends Python by SIGINT (-2).
    assert process.returncode == (0 if ending == "exit" else -signal.SIGINT), stderr[-2000:]
    if ending == "hang":
        assert "KeyboardInterrupt" in stderr
    deadline = time.monotonic() + patience(20)
    while (alive := [pid for pid in children if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == []


def test_a_decoded_reward_pickles_without_its_pool():
    """Sent to a Ray actor, it starts its own pool there."""
    import pickle

    tokenizer = build_char_tokenizer()
    with DecodedReward(tokenizer, "tests.rewards.scorers:unruly", workers=1) as reward:
        reward.score(["#### 7"], ["7"])  # the pool is up
        copy = pickle.loads(pickle.dumps(reward))
        assert copy._pool is None and reward._pool is not None
        with copy:
            assert copy.score(["#### 7", "boom"], ["7", "7"]) == ([1.0, 0.0], ["ok", "errors"])
