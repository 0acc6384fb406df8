"""Learning metrics of five short quick starts at one thread, as JSON: run it before and
after a refactor and ``cmp`` the two files (identical means behaviour unchanged).

    .venv/bin/python scripts/learning_fingerprint.py before.json   # on the old commit
    .venv/bin/python scripts/learning_fingerprint.py after.json    # on the new one
    cmp before.json after.json

Timings (``perf/``, ``time/``) and the buffer backlog (``buffer/size``, a timing figure
in the concurrent modes) are left out; everything else of every step is kept.
"""

from __future__ import annotations

import json
import sys

import torch

from pipelines.run import run_experiment
from pipelines.spec import load_spec

SHORT = ["trainer.steps=12", "trainer.batch_size=64", "orchestrator.eval_every=6", "task.eval_size=40"]
VARIANTS = {
    "lagged1": [],
    "sync": ["orchestrator.mode=sync"],
    "lagged0": ["orchestrator.lag=0"],
    "m2po": ["algorithm.name=m2po", "algorithm.loss_agg=token-mean"],
    "ray": ["runtime.kind=ray", "rollout.workers=2", "orchestrator.mode=sync"],
}


def fingerprint() -> dict[str, list[dict[str, float]]]:
    torch.set_num_threads(1)
    out = {}
    for label, extra in VARIANTS.items():
        result = run_experiment(load_spec("experiments/quickstart.yaml", [*SHORT, *extra]), track=False)
        timing = ("perf/", "time/", "buffer/size")
        out[label] = [{k: v for k, v in step.items() if not k.startswith(timing)} for step in result.history.steps]
        print(label, out[label][-1].get("eval/accuracy"), out[label][-1]["reward/mean"], flush=True)
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(fingerprint(), f, indent=0, sort_keys=True)
