"""The benchmark cases: each a function of its parameters returning :class:`Figure` s,
with the design goals (``TARGETS``) they are shown beside. The suites that run them are
in :mod:`pipelines.bench.suite`."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipelines.bench import scale

__all__ = ["CASES", "LEARNING_SLACK", "TARGETS", "Case", "Figure"]

LAGGED = ["orchestrator.mode=lagged", "orchestrator.lag=1"]  # the quick start's schedule

# Design goals (a figure's ``target``): rewards on device at least 5× the per-row loop
# and 20× decoding, within 6× a bare pass over the tokens, no slower on adversarial input
# than the column scan; async at least 1.8× sync with the trainer idle ≤ 10% when
# rollout has its own device (the simulated latency setting); every M2PO mode within
# 1.5× PPO's forward+backward at 1M tokens.
TARGETS: dict[str, float] = {
    "reward.speedup_vs_loop": 5.0,
    "reward.speedup_vs_decode": 20.0,
    "reward.ratio_to_bare_pass": 6.0,
    "reward.adversarial_vs_scan": 0.9,
    "pipeline.latency.async_speedup": 1.8,
    "pipeline.latency.bubble_frac_trainer": 0.10,
    "checkpoint.cost_frac": 0.03,
    "losses.m2po_vs_ppo": 1.5,
    "losses.m2po_trust_region_vs_ppo": 1.5,
    "losses.m2po_token_vs_ppo": 1.5,
    "sharded.training_memory.2_ranks": 0.6,  # FSDP2 per-rank memory at N = 2 against N = 1
    "sharded.publishing_memory.2_ranks": 0.6,
    "sharded.evaluating_memory.2_ranks": 0.6,
    "inflight.latency.s2.inflight_vs_async": 1.3,  # a long tail of response lengths (issue 27)
}
REWARD_FIGURES: dict[str, Literal["higher", "lower"]] = {
    "speedup_vs_loop": "higher",
    "speedup_vs_decode": "higher",
    "ratio_to_bare_pass": "lower",
    "adversarial_vs_scan": "higher",
}


@dataclass
class Figure:
    """One benchmark figure.

    ``tolerance`` is relative to the baseline (``--tolerance`` when None) unless
    ``absolute`` is set, in which case it is in the figure's own unit. ``gate=False``
    records an informational figure without gating on it.
    """

    name: str
    median: float
    min: float
    max: float
    better: Literal["higher", "lower"]
    unit: str = "×"
    tolerance: float | None = None
    absolute: bool = False
    gate: bool = True
    note: str = ""
    target: float | None = None  # what the figure should reach (informational; ``better`` says which side)

    @property
    def meets_target(self) -> bool | None:
        if self.target is None:
            return None
        return self.median >= self.target if self.better == "higher" else self.median <= self.target

    @classmethod
    def of(cls, name: str, values: list[float], better: Literal["higher", "lower"], **kwargs: Any) -> Figure:
        return cls(name, statistics.median(values), min(values), max(values), better, **kwargs)


Case = Callable[[dict[str, Any]], list[Figure]]


# ------------------------------------------------------------------------ cases
def _reward_case(params: dict[str, Any]) -> list[Figure]:
    from pipelines.bench import rewards

    figures, device = [], params.get("device", "cpu")
    for batch, length in params["shapes"]:
        runs = [
            rewards.run(batch, length, device=device, repeats=params["repeats"])["ratios"]
            for _ in range(params["rounds"])
        ]
        tag = f"B{batch}_L{length}"
        for key, better in REWARD_FIGURES.items():
            target = TARGETS[f"reward.{key}"]
            figures.append(Figure.of(f"reward.{key}.{tag}", [r[key] for r in runs], better, target=target))
    return figures


def _losses_case(params: dict[str, Any]) -> list[Figure]:
    from pipelines.bench import losses

    device = params.get("device", "cpu")
    runs = [losses.run(params["tokens"], repeats=params["repeats"], device=device) for _ in range(params["rounds"])]
    names = ("m2po_vs_ppo", "m2po_trust_region_vs_ppo", "m2po_token_vs_ppo", "grpo_vs_ppo")
    at_size = params["tokens"] >= 1 << 20  # the target is set at 1M tokens; below, fixed costs dominate
    return [
        Figure.of(
            f"losses.{name}",
            [r[name] for r in runs],
            "lower",
            note="fwd+bwd time ratio",
            target=TARGETS.get(f"losses.{name}") if at_size else None,
        )
        for name in names
    ]


def _decoded_case(params: dict[str, Any]) -> list[Figure]:
    from pipelines.bench import decoded

    runs = [decoded.run(params["batch"], tuple(params["workers"]), params["repeats"]) for _ in range(params["rounds"])]
    # Process scheduling on a shared machine swings these: reported, not gated.
    figures = [
        Figure.of(
            f"decoded.{name}",
            [r["ratios"][name] for r in runs],
            "higher",
            gate=False,
            note="samples/s ratio, same batch",
        )
        for name in runs[0]["ratios"]
    ]
    for kind, rates in runs[0]["rates"].items():
        figures += [
            Figure.of(
                f"decoded.{kind}.{method}_per_s",
                [r["rates"][kind][method] for r in runs],
                "higher",
                unit="/s",
                gate=False,
            )
            for method in rates
        ]
    return figures


def _buffer_case(params: dict[str, Any]) -> list[Figure]:
    from pipelines.bench import buffer

    results = buffer.run(params["items"], params["repeats"])
    # Six Python threads on one lock: GIL scheduling makes these ratios bimodal from run
    # to run (0.1× to 0.8× seen for identical code, in wall and in CPU time alike), so
    # they are reported, not gated. The accounting identity is asserted in every run.
    return [
        Figure(
            f"buffer.{name}_vs_deque",
            r["median"],
            r["min"],
            r["max"],
            "higher",
            gate=False,
            note="4 producers, 2 consumers",
        )
        for name, r in results.items()
    ]


def _pipeline_case(params: dict[str, Any]) -> list[Figure]:
    from pipelines.bench import pipeline

    figures = []
    for setting in params["settings"]:
        r = pipeline.run(setting, steps=params["steps"], repeats=params["repeats"])
        gate = setting == "latency"  # the in-process figure depends on core contention: informational
        s, b = r["speedup"], r["async"]["bubble_frac_trainer"]
        speedup, bubble = (TARGETS.get(f"pipeline.{setting}.{k}") for k in ("async_speedup", "bubble_frac_trainer"))
        figures += [
            Figure(
                f"pipeline.{setting}.async_speedup",
                s["median"],
                s["min"],
                s["max"],
                "higher",
                gate=gate,
                target=speedup,
            ),
            Figure(
                f"pipeline.{setting}.bubble_frac_trainer",
                b["median"],
                b["min"],
                b["max"],
                "lower",
                unit="",
                tolerance=0.05,
                absolute=True,
                gate=gate,
                target=bubble,
            ),
        ]
    return figures


def _step_case(params: dict[str, Any]) -> list[Figure]:
    """The quick start's step: generation with a shared prompt prefill, and training that
    reads each prompt once and leaves zero-advantage rows out, each against the way every
    row used to be paid for."""
    from pipelines.bench import step

    runs = [step.run(repeats=params["repeats"]) for _ in range(params["rounds"])]
    signal = runs[0]["signal_rows"]
    return [
        Figure.of(
            "step.generate_shared_prefill_speedup",
            [r["generate_speedup"] for r in runs],
            "higher",
            note=f"{step.PROMPTS} prompts × {step.GROUP} samples, 5 new tokens, 1 thread",
        ),
        Figure.of(
            "step.train_speedup",
            [r["train_speedup"] for r in runs],
            "higher",
            note=f"shared prompts + zero-advantage rows left out; {signal:.0%} of rows with signal",
        ),
        Figure.of(
            "step.train_shared_prompts_speedup",
            [r["train_share_speedup"] for r in runs],
            "higher",
            note="shared prompts alone",
        ),
    ]


def _quickstart_spec(overrides: list[str], tracking_uri: str) -> Any:
    from pipelines.spec import load_spec

    # the quick start's spec, shipped beside this module (a link to experiments/ in a clone)
    return load_spec(Path(__file__).with_name("quickstart.yaml"), [*overrides, f"tracking.uri={tracking_uri}"])


def _learning_case(params: dict[str, Any]) -> list[Figure]:
    """The quick start's accuracy gain over kernel settings × seeds (one subprocess each).

    Every cell starts from the shipped checkpoint; lagged k = 1 makes each cell
    deterministic, so the spread is that of seeds and CPU kernels, not thread timing.
    The gate is on the mean over the cells, which moves far less from machine to machine
    than one run (see ``LEARNING_SLACK``).
    """
    from pipelines.bench import learning

    result = learning.run_matrix(params["kernels"], params["seeds"], params["overrides"], log=print)
    figures = []
    overall = result["all"]
    note = f"mean of {overall['n']} cells: kernels {params['kernels']} × seeds {params['seeds']}"
    figures.append(
        Figure(
            "learning.quickstart_accuracy_gain",
            overall["mean"],
            overall["min"],
            overall["max"],
            "higher",
            unit="points",
            tolerance=LEARNING_SLACK,
            absolute=True,
            note=note,
        )
    )
    for name, k in result["by_kernels"].items():
        figures.append(
            Figure(
                f"learning.quickstart_accuracy_gain.{name}",
                k["mean"],
                k["min"],
                k["max"],
                "higher",
                unit="points",
                gate=False,
                note=f"seeds {params['seeds']}",
            )
        )
    times = [c["run_s"] for c in result["cells"]]
    figures.append(Figure.of("learning.quickstart_run_s", times, "lower", unit="s", gate=False, note="per cell"))
    return figures


def _overhead_case(params: dict[str, Any]) -> list[Figure]:
    """Share of the run spent in tracking, and in orchestration (sync mode: everything
    that is neither generating, rewarding, training nor evaluating), as CPU time of the
    loop's thread: in sync mode with one torch thread that thread does all the work, and
    CPU time, unlike wall time, does not grow when other processes take the cores (wall
    shares failed the gate at a load average of 5.8 on 2 cores)."""
    from pipelines.run import run_experiment

    tracking, orchestration = [], []
    overrides = [*params["overrides"], "orchestrator.mode=sync", "runtime.torch_threads=1"]
    with tempfile.TemporaryDirectory() as tmp:  # a first tracked run pays MLflow's one-off set-up: not measured
        run_experiment(_quickstart_spec([*overrides, "trainer.steps=2"], f"sqlite:///{tmp}/mlflow.db"))
    for _ in range(params["repeats"]):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_experiment(_quickstart_spec(overrides, f"sqlite:///{tmp}/mlflow.db"))
        history = result.history
        work = sum(e.cpu or 0.0 for e in history.timeline if e.phase in {"generate", "reward", "train", "eval"})
        loop_cpu = history.summary["time/loop_cpu_s"]
        share = result.final_metrics["perf/tracking_cpu_frac"]
        tracking.append(share)
        orchestration.append(max(0.0, 1.0 - work / loop_cpu - share))
    note = "CPU time of the loop's thread"
    return [
        Figure.of("overhead.tracking_frac", tracking, "lower", unit="", tolerance=0.02, absolute=True, note=note),
        Figure.of(
            "overhead.orchestration_frac", orchestration, "lower", unit="", tolerance=0.03, absolute=True, note=note
        ),
    ]


def _checkpoint_case(params: dict[str, Any]) -> list[Figure]:
    """Checkpoint writing as a share of run time, at the default interval
    (``trainer.checkpoint_every``), in lagged mode (its ring of stale snapshots included)."""
    from pipelines.run import run_experiment

    shares = []
    for _ in range(params["repeats"]):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_experiment(_quickstart_spec([*params["overrides"], *LAGGED], f"sqlite:///{tmp}/mlflow.db"))
        shares.append(result.final_metrics["perf/checkpoint_frac"])
    target, note = TARGETS["checkpoint.cost_frac"], "share of run time spent writing checkpoints"
    return [
        Figure.of(
            "checkpoint.cost_frac", shares, "lower", unit="", tolerance=0.02, absolute=True, target=target, note=note
        )
    ]


# Absolute slack of the gated learning figure (a mean gain over seeds), in accuracy
# points, derived from the spread measured by the `matrix` suite (3 kernel settings ×
# 3 seeds, 2026-12-01, AMD EPYC): per-kernel 3-seed means +24.2 (native AVX2), +24.2
# (avx2), +25.2 (SSE-only), so another machine's mean moves by D = 1.0 point; the cells'
# standard deviation is 2.0 points, so a 3-seed mean has a standard error of 1.2.
# D + 2 SE = 3.4 points, rounded up to 5: this quick start's matrix comes from one
# machine (the earlier one's moved by 1.0 point between the Xeon and the AMD EPYC).
LEARNING_SLACK = 0.05


CASES: dict[str, Case] = {
    "reward": _reward_case,
    "decoded": _decoded_case,
    "losses": _losses_case,
    "buffer": _buffer_case,
    "pipeline": _pipeline_case,
    "step": _step_case,
    "learning": _learning_case,
    "overhead": _overhead_case,
    "checkpoint": _checkpoint_case,
    "weight_sync": scale.weight_sync_case,
    "sharded": scale.sharded_case,
    "group_learning": scale.group_learning_case,
    "lora": scale.lora_case,
    "inflight": scale.inflight_case,
    "generation": scale.generation_case,
}
