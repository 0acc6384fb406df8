"""``asyncrlhf bench``: the benchmark suite and its regression gate."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.app import command, console, fail


@command()
def bench(
    suite: Annotated[
        str,
        typer.Option(
            help="'full' (nightly; ~4.5 min plus 3 learning runs of ~135 s on 2 cores), 'quick' (~20 s), "
            "'matrix' (the learning figure over 3 CPU kernel settings × 3 seeds, ~28 min), 'ranks' (a 2-rank trainer "
            "group's learning against one process, 10 seeds, ~2 h), or 'cuda' (rewards and losses on the GPU)."
        ),
    ] = "full",
    baseline: Annotated[Path | None, typer.Option(help="Baseline file (default: the packaged one).")] = None,
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="Rewrite the baseline.")] = False,
    tolerance: Annotated[float, typer.Option(help="Allowed relative worsening for ratio figures.")] = 0.25,
    case: Annotated[list[str] | None, typer.Option("--case", help="Run only these cases (repeatable).")] = None,
    report: Annotated[Path | None, typer.Option(help="Where to write the JSON report.")] = None,
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not log to MLflow.")] = False,
) -> None:
    """Run the benchmark suite; exit 1 when a figure regressed against the baseline."""
    from pipelines.bench import gate
    from pipelines.bench.log import load_average
    from pipelines.bench.suite import environment, run_suite

    baseline = baseline or gate.packaged_baseline()
    if not 0 <= tolerance < 1:
        fail(f"--tolerance must be in [0, 1), got {tolerance}")
    console.print(f"[bold]asyncrlhf bench[/] — suite {suite}")
    try:
        suite_baseline = gate.load_baseline(baseline).get("suites", {}).get(suite, {})
        load, started = load_average(), time.time()  # before the suite loads the machine itself
        figures = run_suite(suite, case, log=console.print)
    except ValueError as err:
        fail(err)
    env = environment()
    comparisons = gate.compare(figures, suite_baseline.get("figures", {}), tolerance)
    against = baseline.name if suite_baseline else "no baseline"
    console.print(gate.comparison_table(f"suite {suite} vs {against}", comparisons))
    if report is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        report = Path("mlflow") / "bench" / f"bench-{suite}-{stamp}.json"  # beside the tracking store
    report.parent.mkdir(parents=True, exist_ok=True)
    summary = gate.report_dict(suite, comparisons, env, suite_baseline.get("environment"))
    report.write_text(json.dumps(summary, indent=2))
    console.print(f"report: {report}")
    regressions = [c for c in comparisons if c.status == "regressed"]
    if not no_track:
        from pipelines.bench.log import log_benchmark

        run_id = log_benchmark(uri, suite, comparisons, {**env, **load}, report, started)
        console.print(f"MLflow: experiment 'benchmarks', run {run_id}")
    if update_baseline:
        gate.write_baseline(baseline, suite, figures, env)
        console.print(f"baseline updated: {baseline} (suite {suite})")
        raise typer.Exit(0)
    for c in regressions:
        figure = f"{c.figure.name}: {c.figure.median:.3f} vs baseline {c.baseline:.3f}"
        console.print(f"[bold red]REGRESSION[/] {figure} (limit {c.limit:.3f}, {c.figure.better} is better)")
    if not suite_baseline:
        console.print(f"[yellow]no baseline for suite {suite} in {baseline}[/]: nothing gated")
    raise typer.Exit(1 if regressions else 0)
