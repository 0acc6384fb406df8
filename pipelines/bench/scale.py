"""The scale cases of the benchmark suite: weight sync against model size, a trainer
group's per-rank memory, LoRA against full fine-tuning (:mod:`pipelines.bench.cases`
lists them; ``Figure`` and ``TARGETS`` come from there, imported when a case runs)."""

from __future__ import annotations

from typing import Any

__all__ = ["lora_case", "sharded_case", "weight_sync_case"]


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
