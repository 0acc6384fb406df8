"""``sync`` and ``lagged`` are exact at the default thread count, loaded or not.

Two runs of one spec, side by side in two processes at torch's default thread count
(each loading the machine for the other, and rollout and training running concurrently
inside each ``lagged`` run), give the same value of every metric at every step but
the timing figures (:data:`asyncrlhf.orchestration.history.TIMING_METRICS`). Before the
trainer gathered shared-prompt KV caches with ``index_select``, two such runs parted at
step 4 by ~1e-7 (sync at step 3): the gather's backward added rows with atomic float
adds across threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from asyncrlhf.orchestration.history import timing_dependent
from tests.helpers import patience
from tests.pipelines.conftest import REPO, env

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys, torch
from pipelines.run import run_experiment
from pipelines.spec import load_spec
out = {"threads": torch.get_num_threads()}
for mode, steps in (("sync", 8), ("lagged", 20)):
    overrides = [f"orchestrator.mode={mode}", "orchestrator.lag=2", f"trainer.steps={steps}",
                 "orchestrator.eval_every=10", "task.eval_size=50"]
    result = run_experiment(load_spec("experiments/sync_baseline.yaml", overrides), track=False)
    out[mode] = {"steps": result.history.steps, "initial": result.history.initial_metrics}
print(json.dumps(out))
"""


def test_two_runs_at_the_default_thread_count_give_identical_metrics_at_every_step():
    processes = [
        subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [json.loads(p.communicate(timeout=patience(600))[0].splitlines()[-1]) for p in processes]
    assert all(p.returncode == 0 for p in processes)
    first, second = outputs
    assert first["threads"] == second["threads"] >= min(2, os.cpu_count() or 1)
    for mode, steps in (("sync", 8), ("lagged", 20)):
        a, b = first[mode], second[mode]
        assert a["initial"] == b["initial"] and len(a["steps"]) == len(b["steps"]) == steps
        for step, (x, y) in enumerate(zip(a["steps"], b["steps"], strict=True), start=1):
            compared = {key for key in x if not timing_dependent(key)}
            assert compared == {key for key in y if not timing_dependent(key)}
            differing = {key: (x[key], y[key]) for key in compared if x[key] != y[key]}
            assert not differing, f"{mode} step {step}: {differing}"
        assert {"loss/policy", "policy/ratio_max", "train/grad_norm"} <= set(a["steps"][-1])
    assert "eval/accuracy" in first["lagged"]["steps"][9]  # evaluations are compared too
