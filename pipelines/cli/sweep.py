"""``asyncrlhf sweep``: a grid or an Optuna study, trials in parallel on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli.app import TrustOpt, command, console, errors, fail, trust


@command()
def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="Sweep YAML file.", show_default=False)],
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override a sweep or base field: key.path=value.")
    ] = None,
    max_trials: Annotated[
        int | None, typer.Option(help="Start at most this many trials now; run the command again to resume.")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Apply the sweep file's own 'quick' overrides.")] = False,
    trust_code: TrustOpt = False,
) -> None:
    """Run (or resume) a grid or Optuna sweep, trials in parallel on Ray, into MLflow."""
    trust(trust_code)
    from pipelines.run.processes import exit_code, sigterm_interrupts
    from pipelines.sweeps import format_value, load_sweep, run_sweep

    spec, base = load_sweep(sweep_file, set_ or [], quick=quick)
    if max_trials is not None and max_trials < 1:
        fail(f"--max-trials must be ≥ 1, got {max_trials}")
    seeds = f" × {len(spec.seeds)} seeds" if spec.seeds else ""
    console.print(
        f"[bold]{spec.name}[/]: {spec.method}, {spec.num_trials} trials{seeds}, {spec.parallel} runs in parallel — "
        f"{spec.direction} {spec.objective}"
    )

    def on_trial(row: dict) -> None:
        params = ", ".join(f"{k}={_short(v)}" for k, v in row["params"].items())
        value = format_value(row) or "—"
        console.print(f"  trial {row['number']:>3} {row['state']:<8} {value:>8}  {params}", highlight=False)

    try:
        with sigterm_interrupts() as received:  # the driver lock is taken before Ray starts: a second copy refuses
            result = run_sweep(spec, base, max_trials=max_trials, on_trial=on_trial)
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]: run the same command again to resume")
        raise typer.Exit(exit_code(received)) from None
    head, cells = result.report.display()
    table = Table(title=f"{spec.name}: trials by {result.report.objective_label}")
    for column in head:
        table.add_column(column)
    for row in cells:
        table.add_row(*row)
    console.print(table)
    done = "complete" if result.complete else f"partial ({len(result.rows)}/{spec.num_trials}): run it again to resume"
    console.print(f"{done}. MLflow parent run {result.parent_run_id} in {result.tracking_uri}; study {result.storage}")
    if result.complete and not any(row["state"] == "COMPLETE" for row in result.rows):
        errors.print("[bold red]error:[/] no trial completed: the sweep's parent run is marked FAILED")
        raise typer.Exit(1)
    console.print("Compare trials: [bold]asyncrlhf ui[/] (open the experiment's runs link, expand the parent run)")


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
