"""The ``asyncrlhf`` command line: run, validate, schema, warmstart, sweep, bench, ui."""

from __future__ import annotations

import json
import math
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipelines.chatmodel import chat_model
from pipelines.spec import ExperimentSpec, SpecError, apply_overrides, load_spec, spec_from_dict
from pipelines.specfile import flatten, run_name_for

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Asynchronous RL post-training experiments.")
console = Console() if Console().is_terminal else Console(width=140)  # logs: no 80-column cut
errors = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 400)

SpecArg = Annotated[Path, typer.Argument(help="Experiment YAML file.", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a field: key.path=value (repeatable).")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Resume even if the spec is not the one the checkpoint was written with.")
]


def _load(spec_path: Path | None, overrides: list[str] | None) -> ExperimentSpec:
    """The spec at ``spec_path`` (None: the defaults) with overrides; exit 2 on bad input."""
    try:
        if spec_path is None:
            return spec_from_dict(apply_overrides({}, overrides or []), source="--set")
        return load_spec(spec_path, overrides or [])
    except SpecError as err:
        _fail(err)


def _fail(message: object) -> NoReturn:
    """Bad input: one line on stderr naming it, exit 2."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


@app.command()
def validate(spec: SpecArg, set_: SetOpt = None) -> None:
    """Check a spec (and overrides) without running anything."""
    experiment = _load(spec, set_)
    console.print(
        f"[green]ok[/] {spec}: {experiment.name} — {experiment.algorithm.name}, {experiment.orchestrator.mode}, "
        f"{experiment.trainer.steps} steps × {experiment.trainer.batch_size} samples"
    )


@app.command()
def schema(output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None) -> None:
    """Print the JSON Schema of experiment specs (for editor validation of YAML)."""
    text = json.dumps(ExperimentSpec.model_json_schema(), indent=2)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n")


@app.command()
def run(
    spec: SpecArg,
    set_: SetOpt = None,
    resume: Annotated[
        str | None, typer.Option(help="Continue this MLflow run from its last checkpoint (same spec but for steps).")
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Run an experiment and log it to MLflow (or continue a stopped run: --resume RUN_ID)."""
    experiment = _load(spec, set_)
    if set_ and resume is None and experiment.tracking.run_name is None:  # the name says what --set changed
        values = flatten(experiment)
        changes = {key: values.get(key, raw) for key, _, raw in (o.partition("=") for o in set_)}
        tracking = experiment.tracking.model_copy(update={"run_name": run_name_for(experiment.name, changes)})
        experiment = experiment.model_copy(update={"tracking": tracking})
    _run(experiment, str(spec), resume, force)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The MLflow run to continue.", show_default=False)],
    set_: SetOpt = None,
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    force: ForceOpt = False,
) -> None:
    """Continue a stopped (or, with a raised trainer.steps, a finished) run from its last checkpoint."""
    from pipelines.tracking import open_store, read_run

    try:
        _, data, _ = read_run(open_store(uri), run_id)
        if uri is not None:
            data.setdefault("tracking", {})["uri"] = uri
        experiment = spec_from_dict(apply_overrides(data, set_ or []), source=f"run {run_id}")
    except (LookupError, SpecError) as err:
        _fail(f"resume: {err}")
    _run(experiment, f"run {run_id}", run_id, force)


@app.command()
def export(
    run_id: Annotated[str, typer.Argument(help="The MLflow run whose trained policy to copy out.", show_default=False)],
    out: Annotated[Path, typer.Option(help="New directory for the policy (Hugging Face layout).", show_default=False)],
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists and is not empty.")] = False,
) -> None:
    """Copy a run's trained policy out of the store: load it with `model.kind: pretrained`, `model.path: OUT`."""
    from pipelines.export import ExportError, export_policy

    try:
        export_policy(run_id, out, uri, overwrite)
    except (ExportError, SpecError) as err:
        _fail(err)
    console.print(f"[green]exported[/] the policy of run {run_id} to {out}")


def _run(experiment: ExperimentSpec, source: str, resume_id: str | None, force: bool = False) -> None:
    from pipelines.checkpoints import CheckpointError
    from pipelines.fit import check_fits
    from pipelines.processes import InterruptedBeforeRun, RunInterrupted, exit_code, sigterm_interrupts
    from pipelines.run import check_resume, run_experiment

    try:  # before anything is shown or built
        check_fits(experiment)
        if resume_id is not None:
            check_resume(experiment, resume_id, force)
    except SpecError as err:
        _fail(err)

    steps = experiment.trainer.steps
    latest: dict[str, float] = {}
    progress = _progress()

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        latest.update(metrics)
        if step == 0:  # the evaluation before any update
            progress.update(task, status=f"start accuracy {metrics['eval/accuracy']:.3f}", description=label)
            return
        accuracy = latest.get("eval/accuracy", math.nan)
        status = (
            f"reward {latest['reward/mean']:.3f}  acc {accuracy:.3f}  staleness {latest['staleness/mean']:.2f}  "
            f"{latest['perf/samples_per_s']:.0f} samples/s"
        )
        progress.update(task, completed=step, status=status, description=label)

    console.print(f"[bold]{experiment.name}[/]: {experiment.description or source}")
    label = f"{experiment.algorithm.name}/{experiment.orchestrator.mode}"
    with progress:
        task = progress.add_task(f"{label} (building the model)", total=steps, status="")
        try:
            with sigterm_interrupts() as received:  # SIGTERM as Ctrl-C; while training, a stop at the step's end
                result = run_experiment(experiment, on_metrics=on_metrics, resume=resume_id, force_resume=force)
        except (SpecError, CheckpointError) as err:  # refused before any run was created or reopened
            _fail(err)
        except InterruptedBeforeRun as err:
            errors.print(f"[yellow]interrupted[/] ({received[0] if received else 'SIGINT'}) {err}")
            raise typer.Exit(exit_code(received)) from None
        except RunInterrupted as err:
            errors.print(f"[yellow]{err}[/]: checkpointed, the MLflow run is marked KILLED; "
                         "`asyncrlhf resume RUN_ID` continues it")  # fmt: skip
            raise typer.Exit(143 if str(err).startswith("SIGTERM") else 130) from None
        except KeyboardInterrupt:
            errors.print("[yellow]interrupted[/]: the MLflow run is marked KILLED")
            raise typer.Exit(exit_code(received)) from None
        except Exception as err:  # the run is already marked FAILED
            errors.print(f"[bold red]run failed:[/] {type(err).__name__}: {err}", highlight=False)
            raise typer.Exit(1) from None
    _summary(result)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _summary(result) -> None:  # type: ignore[no-untyped-def]
    final = result.final_metrics
    initial = result.history.initial_metrics.get("eval/accuracy")
    table = Table(title="summary", show_header=False)
    if initial is not None and "eval/accuracy" in final:
        table.add_row("held-out accuracy", f"{initial:.3f} → {final['eval/accuracy']:.3f}")
    for key, label in [
        ("reward/mean", "last reward/mean"),
        ("perf/samples_per_s", "samples/s"),
        ("perf/bubble_frac_trainer", "trainer bubble"),
        ("perf/tracking_frac", "tracking share of time"),
        ("time/total_s", "wall time (s)"),
    ]:
        if key in final:
            table.add_row(label, f"{final[key]:.3f}" if abs(final[key]) < 100 else f"{final[key]:.0f}")
    table.add_row("MLflow run", str(result.run_id))
    table.add_row("store", str(result.tracking_uri))
    console.print(table)
    console.print("Compare runs: [bold]asyncrlhf ui[/] (open the runs link it prints for this experiment)")


@app.command()
def warmstart(
    out: Annotated[Path, typer.Option(help="New directory to write the checkpoint to.", show_default=False)],
    spec: Annotated[
        Path | None, typer.Argument(help="Experiment whose model section to build (default: the defaults).")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Build a start checkpoint (tiny model + supervised warm start) and measure it.

    The default one ships with the package: runs load it and never train it. Use this to
    rebuild it (weights differ across CPUs) or to make your own; point a spec at the
    result with `model.kind: pretrained` and `model.path`.
    """
    from pipelines.warmstart import write_start_checkpoint

    experiment = _load(spec, set_)
    try:
        manifest = write_start_checkpoint(experiment, out)
    except ValueError as err:
        _fail(err)
    evaluation = manifest["eval"]
    console.print(
        f"[green]wrote[/] {out}: {manifest['warm_start']['steps']} warm-start steps, final loss "
        f"{manifest['final_loss']:.4f} ({manifest['built_with']['cpu_capability']} kernels)\n"
        f"held-out greedy accuracy {evaluation['greedy_accuracy']:.3f} on {evaluation['eval_size']} "
        f"{evaluation['task']} problems\nsha256 {manifest['sha256']}",
        soft_wrap=True,
    )


@app.command()
def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="Sweep YAML file.", show_default=False)],
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override a sweep or base field: key.path=value.")
    ] = None,
    max_trials: Annotated[
        int | None, typer.Option(help="Start at most this many trials now; run the command again to resume.")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Apply the sweep file's own 'quick' overrides.")] = False,
) -> None:
    """Run (or resume) a grid or Optuna sweep, trials in parallel on Ray, into MLflow."""
    from pipelines.processes import exit_code, sigterm_interrupts
    from pipelines.sweeps import format_value, load_sweep, run_sweep

    try:
        spec, base = load_sweep(sweep_file, set_ or [], quick=quick)
    except SpecError as err:
        _fail(err)
    if max_trials is not None and max_trials < 1:
        _fail(f"--max-trials must be ≥ 1, got {max_trials}")
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
    except SpecError as err:
        _fail(err)
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


@app.command()
def bench(
    suite: Annotated[
        str,
        typer.Option(
            help="'full' (nightly; ~3.5 min plus 3 learning runs of ~135 s on 2 cores), 'quick' (~20 s), "
            "'matrix' (the learning figure over 3 CPU kernel settings × 3 seeds, ~28 min), or 'cuda' (rewards and "
            "losses on the GPU)."
        ),
    ] = "full",
    baseline: Annotated[Path, typer.Option(help="Baseline file to gate against.")] = Path("benchmarks/baseline.json"),
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="Rewrite the baseline.")] = False,
    tolerance: Annotated[float, typer.Option(help="Allowed relative worsening for ratio figures.")] = 0.25,
    case: Annotated[list[str] | None, typer.Option("--case", help="Run only these cases (repeatable).")] = None,
    report: Annotated[Path | None, typer.Option(help="Where to write the JSON report.")] = None,
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not log to MLflow.")] = False,
) -> None:
    """Run the benchmark suite; exit 1 when a figure regressed against the baseline."""
    from benchmarks.suite import environment, run_suite
    from pipelines.bench import compare, comparison_table, load_baseline, report_dict, write_baseline
    from pipelines.benchlog import load_average

    if not 0 <= tolerance < 1:
        _fail(f"--tolerance must be in [0, 1), got {tolerance}")
    console.print(f"[bold]asyncrlhf bench[/] — suite {suite}")
    try:
        suite_baseline = load_baseline(baseline).get("suites", {}).get(suite, {})
        load = load_average()  # before the suite loads the machine itself
        figures = run_suite(suite, case, log=console.print)
    except ValueError as err:
        _fail(err)
    env = environment()
    comparisons = compare(figures, suite_baseline.get("figures", {}), tolerance)
    against = baseline.name if suite_baseline else "no baseline"
    console.print(comparison_table(f"suite {suite} vs {against}", comparisons))
    if report is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        report = Path("mlflow") / "bench" / f"bench-{suite}-{stamp}.json"  # beside the tracking store
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(report_dict(suite, comparisons, env, suite_baseline.get("environment")), indent=2))
    console.print(f"report: {report}")
    regressions = [c for c in comparisons if c.status == "regressed"]
    if not no_track:
        from pipelines.benchlog import log_benchmark

        run_id = log_benchmark(uri, suite, comparisons, {**env, **load}, report)
        console.print(f"MLflow: experiment 'benchmarks', run {run_id}")
    if update_baseline:
        write_baseline(baseline, suite, figures, env)
        console.print(f"baseline updated: {baseline} (suite {suite})")
        raise typer.Exit(0)
    for c in regressions:
        console.print(f"[bold red]REGRESSION[/] {c.figure.name}: {c.figure.median:.3f} vs baseline {c.baseline:.3f} "
                      f"(limit {c.limit:.3f}, {c.figure.better} is better)")  # fmt: skip
    if not suite_baseline:
        console.print(f"[yellow]no baseline for suite {suite} in {baseline}[/]: nothing gated")
    raise typer.Exit(1 if regressions else 0)


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 5000,
    host: Annotated[str, typer.Option(help="Interface to bind (local only by default).")] = "127.0.0.1",
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
) -> None:
    """Serve the MLflow UI for the local store (runs whose process died are marked KILLED first)."""
    from pipelines.processes import port_in_use, serve
    from pipelines.tracking import open_store, resolve_tracking_uri, tag_experiments

    if port_in_use(host, port):  # before any link is printed: the server would fail, and exit 0
        _fail(f"--port {port} on {host} is in use: choose another with --port")
    store = resolve_tracking_uri(uri)
    try:
        experiments = tag_experiments(open_store(store))  # initialised and reconciled before the server reads it
    except SpecError as err:  # a damaged store
        _fail(err)
    mlflow_bin = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    command = [mlflow_bin, "ui", "--backend-store-uri", store, "--host", host, "--port", str(port)]
    base, mode = f"http://{host}:{port}/#/experiments", "workflowType=machine_learning"
    console.print(f"MLflow UI for {store} (Ctrl-C to stop): {base}?{mode}", soft_wrap=True)
    for experiment in experiments[:10]:  # MLflow 3 opens an experiment on GenAI pages unless told
        console.print(f"  {experiment.name}: {base}/{experiment.experiment_id}/runs?{mode}", soft_wrap=True)
    raise typer.Exit(serve(command))


app.command("chat-model")(chat_model)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
