"""The scale cases of the benchmark suite: weight sync against model size, a trainer
group's per-rank memory, LoRA against full fine-tuning (:mod:`pipelines.bench.cases`
lists them; ``Figure`` and ``TARGETS`` come from there, imported when a case runs)."""

from __future__ import annotations

from typing import Any

__all__ = ["GROUP_ARMS", "group_learning_case", "lora_case", "sharded_case", "weight_sync_case"]


def weight_sync_case(params: dict[str, Any]) -> list[Any]:
    """Sync time per version against model size, process group vs object store
    (informational: both depend on the machine's memory bandwidth and core count)."""
    from pipelines.bench import weightsync
    from pipelines.bench.cases import Figure

    figures = []
    for parameters, r in weightsync.run(params["sizes"], params["receivers"], params["repeats"]).items():
        size, note = (
            f"{parameters / 1e6:g}M",
            f"{parameters / 1e6:g}M float32 parameters, {params['receivers']} receivers",
        )
        for name, unit in (("object_store", "s"), ("collective", "s"), ("collective_vs_store", "×")):
            v = r[name]
            figures.append(
                Figure(
                    f"weight_sync.{size}.{name}", v["median"], v["min"], v["max"], "lower", unit, gate=False, note=note
                )
            )
    return figures


def sharded_case(params: dict[str, Any]) -> list[Any]:
    """Per-rank memory of a 2-rank FSDP2 trainer against one process (about 50M
    parameters) training, publishing and evaluating; the largest rank's ratio, so what
    rank 0 holds of a publication counts."""
    from pipelines.bench import sharded
    from pipelines.bench.cases import TARGETS, Figure

    r = sharded.run(tuple(params["worlds"]), params["parallel"])
    note = f"{r['parameters'] / 1e6:.0f}M parameters, {params['parallel']}, largest rank / one process"
    return [
        Figure(name, ratio, ratio, ratio, "lower", gate=False, note=note, target=TARGETS.get(name))
        for phase in ("training", "publishing", "evaluating")
        for world, ratio in r[phase]["ratio"].items()
        if world > 1
        for name in [f"sharded.{phase}_memory.{world}_ranks"]
    ]


def lora_case(params: dict[str, Any]) -> list[Any]:
    """LoRA against full fine-tuning on the 57M model: training memory and step time."""
    from pipelines.bench import sharded
    from pipelines.bench.cases import Figure

    r = sharded.run_lora()
    note = f"r=8 on q/k/v/o_proj; {r['lora_mb']:.0f} MB vs {r['full_mb']:.0f} MB"
    return [
        Figure(f"lora.{name}", r[name], r[name], r[name], "lower", gate=False, note=note)
        for name in ("memory_ratio", "step_ratio")
    ]


def inflight_case(params: dict[str, Any]) -> list[Any]:
    """Sync, async and in-flight under a long tail of response lengths (see
    :mod:`pipelines.bench.inflight`): in-flight / async samples/s and every mode's
    trainer bubble, per staleness bound."""
    from pipelines.bench import inflight
    from pipelines.bench.cases import TARGETS, Figure

    figures = []
    for setting in params["settings"]:
        for bound in params["max_staleness"]:
            r = inflight.run(setting, steps=params["steps"], repeats=params["repeats"], max_staleness=bound)
            tag = f"inflight.{setting}.s{bound}"
            target = TARGETS.get(f"{tag}.inflight_vs_async")
            for key in ("inflight_vs_async", "async_vs_sync"):
                v = r[key]
                lengths = r["median_length"]["median"], r["p95_length"]["median"]
                note = f"samples/s ratio; response lengths median {lengths[0]:g}, p95 {lengths[1]:g}"
                figures.append(
                    Figure(
                        f"{tag}.{key}",
                        v["median"],
                        v["min"],
                        v["max"],
                        "higher",
                        gate=False,
                        note=note,
                        target=target if key == "inflight_vs_async" else None,
                    )
                )
            for mode in inflight.MODES:
                b = r[mode]["bubble_frac_trainer"]
                figures.append(
                    Figure(
                        f"{tag}.{mode}.bubble_frac_trainer",
                        b["median"],
                        b["min"],
                        b["max"],
                        "lower",
                        unit="",
                        gate=False,
                    )
                )
    return figures


def generation_case(params: dict[str, Any]) -> list[Any]:
    """HF against vLLM generation throughput, and vLLM's in-place weight update against a
    full reload (see :mod:`pipelines.bench.generation`); none where vLLM is absent."""
    import sys

    from pipelines.bench import generation
    from pipelines.bench.cases import Figure

    r = generation.run(**params)
    if "skipped" in r:
        print(f"generation: {r['skipped']}", file=sys.stderr)
        return []
    note = f"{r['prompts']} prompts × {r['samples']}, up to {r['max_new_tokens']} tokens"
    rates = f"vLLM {r['vllm_tokens_per_s']:,.0f} vs HF {r['hf_tokens_per_s']:,.0f} tokens/s"
    loads = f"full reload {r['full_reload_s']:.2f} s vs in place {r['in_place_load_s'] * 1e3:.0f} ms"
    return [
        Figure.of("generation.vllm_vs_hf", [r["vllm_vs_hf"]], "higher", gate=False, note=f"{note}; {rates}"),
        Figure.of(
            "generation.full_reload_vs_in_place", [r["full_reload_vs_in_place"]], "higher", gate=False, note=loads
        ),
    ]


# The arms of the group-learning study: the quick start on the Ray runtime, one rollout
# actor, half a CPU each; one trainer process, the same reading every row whole (the
# control: the same update, only float rounding tells it from the first), and two ranks.
GROUP_ARMS: dict[str, list[str]] = {
    "one": ["runtime.trainer.ranks=1"],
    "one_rows_whole": ["runtime.trainer.ranks=1", "trainer.share_prompts=false"],
    "two": ["runtime.trainer.ranks=2"],
}
_GROUP_BASE = [
    "runtime.kind=ray",
    "runtime.torch_threads=1",
    "runtime.trainer.num_cpus=0.5",
    "runtime.rollout.num_cpus=0.5",
    "rollout.workers=1",
]


def group_learning_case(params: dict[str, Any]) -> list[Any]:
    """Does a trainer group learn as much as one process? The quick start's 800 steps per
    seed in each arm of :data:`GROUP_ARMS` (one subprocess each), and the paired
    differences of the final held-out accuracy: two ranks − one process, against the
    control one process reading rows whole − one process, a difference of float rounding
    alone. Past a few hundred steps a float-rounding difference has become a different
    run, so the control measures how far two runs that differ only in rounding land
    apart; the group learns as much when its differences look like the control's."""
    from pipelines.bench import learning
    from pipelines.sweeps.stats import summarize

    seeds, arms = params["seeds"], params.get("arms", list(GROUP_ARMS))
    gains: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    for seed in seeds:
        for arm in arms:
            cell = learning.run_in_subprocess("native", seed, [*_GROUP_BASE, *GROUP_ARMS[arm], *params["overrides"]])
            gains[arm][seed] = cell["gain"]
            print(
                f"  group_learning {arm:<15} seed {seed}: gain {cell['gain']:+.3f} in {cell['run_s']:.0f} s", flush=True
            )
    figures = []
    for arm in arms:
        values = list(gains[arm].values())
        s = summarize(values)
        note = f"mean gain over seeds {seeds} (95% CI ± {s.ci95:.3f}, sd {s.std:.3f})"
        figures.append(_mean_figure(f"group_learning.{arm}.gain", values, s.mean, note))
    for arm in arms:
        if arm == "one" or "one" not in arms:
            continue
        diffs = [gains[arm][seed] - gains["one"][seed] for seed in seeds]
        s = summarize(diffs)
        note = f"paired over seeds {seeds}: 95% CI ± {s.ci95:.4f}, sd {s.std:.4f}"
        figures.append(_mean_figure(f"group_learning.{arm}_minus_one", diffs, s.mean, note))
    return figures


def _mean_figure(name: str, values: list[float], mean: float, note: str) -> Any:
    """An informational figure of a mean over seeds (the suite's figures are otherwise medians)."""
    from pipelines.bench.cases import Figure

    return Figure(name, mean, min(values), max(values), "higher", unit="points", gate=False, note=note)
