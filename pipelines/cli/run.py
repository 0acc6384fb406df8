"""``asyncrlhf run``, ``resume``, ``validate``, ``schema``, ``export``, ``warmstart`` and ``chat-model``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipelines.cli.app import ForceOpt, SetOpt, SpecArg, TrustOpt, app, command, console, errors, fail, load, trust
from pipelines.run.chatmodel import chat_model
from pipelines.spec import ExperimentSpec, SpecError, spec_from_dict
from pipelines.spec.files import apply_overrides, flatten
from pipelines.tracking.names import CHANGED_TAG, run_name_for


@command()
def validate(spec: SpecArg, set_: SetOpt = None) -> None:
    """Check an experiment or sweep spec (and overrides) without running anything: no
    user code is imported, and what a run would import is listed."""
    from pipelines.spec.files import read_yaml
    from pipelines.spec.trust import without_imports

    with without_imports() as unchecked:
        if _is_sweep(read_yaml(spec)):
            from pipelines.sweeps import load_sweep

            sweep, _ = load_sweep(spec, set_ or [])
            seeds = f" × {len(sweep.seeds)} seeds" if sweep.seeds else ""
            summary = (
                f"sweep {sweep.name} — {sweep.method}, {sweep.num_trials} trials{seeds} over {', '.join(sweep.space)}"
            )
        else:
            experiment = load(spec, set_)
            summary = (
                f"{experiment.name} — {experiment.algorithm.name}, {experiment.orchestrator.mode}, "
                f"{experiment.trainer.steps} steps × {experiment.trainer.batch_size} samples"
            )
    console.print(f"[green]ok[/] {spec}: {summary}", highlight=False, soft_wrap=True)
    for note in unchecked:  # user code is never imported here: a run needs --trust-code for it
        console.print(f"  not imported: {note}", highlight=False, soft_wrap=True)
    if any(note.startswith("would import") for note in unchecked):
        console.print("  `run` and `sweep` refuse this code unless given --trust-code", highlight=False)


def _is_sweep(data: dict) -> bool:
    """A sweep file has a base experiment and a search space; an experiment has neither."""
    return "space" in data or "base" in data


@command()
def schema(output: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None) -> None:
    """Print the JSON Schema of experiment specs (for editor validation of YAML)."""
    text = json.dumps(ExperimentSpec.model_json_schema(), indent=2)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n")


@command()
def run(
    spec: SpecArg,
    set_: SetOpt = None,
    resume: Annotated[
        str | None, typer.Option(help="Continue this MLflow run from its last checkpoint (same spec but for steps).")
    ] = None,
    force: ForceOpt = False,
    trust_code: TrustOpt = False,
) -> None:
    """Run an experiment and log it to MLflow (or continue a stopped run: --resume RUN_ID)."""
    trust(trust_code)
    experiment = load(spec, set_)
    if set_ and resume is None and experiment.tracking.run_name is None:  # the name says what --set changed
        values = flatten(experiment)
        changes = {key: values.get(key, raw) for key, _, raw in (o.partition("=") for o in set_)}
        name, tags = (
            run_name_for(experiment.name, changes),
            {**experiment.tracking.tags, CHANGED_TAG: json.dumps(list(changes))},
        )
        tracking = experiment.tracking.model_copy(update={"run_name": name, "tags": tags})
        experiment = experiment.model_copy(update={"tracking": tracking})
    _run(experiment, str(spec), resume, force)


@command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The MLflow run to continue.", show_default=False)],
    set_: SetOpt = None,
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    force: ForceOpt = False,
    trust_code: TrustOpt = False,
) -> None:
    """Continue a stopped (or, with a raised trainer.steps, a finished) run from its last checkpoint."""
    from pipelines.tracking import open_store, read_run

    trust(trust_code)
    try:
        _, data, _ = read_run(open_store(uri), run_id)
        if uri is not None:
            data.setdefault("tracking", {})["uri"] = uri
        experiment = spec_from_dict(apply_overrides(data, set_ or []), source=f"run {run_id}")
    except (LookupError, SpecError) as err:
        fail(f"resume: {err}")
    _run(experiment, f"run {run_id}", run_id, force)


@command()
def export(
    run_id: Annotated[str, typer.Argument(help="The MLflow run whose trained policy to copy out.", show_default=False)],
    out: Annotated[Path, typer.Option(help="New directory for the policy (Hugging Face layout).", show_default=False)],
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists and is not empty.")] = False,
) -> None:
    """Copy a run's trained policy out of the store: load it with `model.kind: pretrained`, `model.path: OUT`."""
    from pipelines.tracking.export import ExportError, export_policy

    try:
        export_policy(run_id, out, uri, overwrite)
    except ExportError as err:
        fail(err)
    console.print(f"[green]exported[/] the policy of run {run_id} to {out}")


def _run(experiment: ExperimentSpec, source: str, resume_id: str | None, force: bool = False) -> None:
    from pipelines.run import check_resume, run_experiment
    from pipelines.run.checkpoint_store import CheckpointError
    from pipelines.run.processes import InterruptedBeforeRun, RunInterrupted, exit_code, sigterm_interrupts
    from pipelines.spec.memory import check_fits

    check_fits(experiment)  # before anything is shown or built
    if resume_id is not None:
        check_resume(experiment, resume_id, force)

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
            fail(err)
        except InterruptedBeforeRun as err:
            errors.print(f"[yellow]interrupted[/] ({received[0] if received else 'SIGINT'}) {err}")
            raise typer.Exit(exit_code(received)) from None
        except RunInterrupted as err:
            errors.print(
                f"[yellow]{err}[/]: checkpointed, the MLflow run is marked KILLED; "
                "`asyncrlhf resume RUN_ID` continues it"
            )
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
    if result.run_id is not None:
        from pipelines.tracking import open_store
        from pipelines.tracking.names import run_url

        experiment_id = open_store(result.tracking_uri).get_run(result.run_id).info.experiment_id
        link = run_url("http://127.0.0.1:5000", experiment_id, result.run_id)
        console.print(f"With [bold]asyncrlhf ui[/] serving: this run {link}", soft_wrap=True)
    console.print("Compare runs: [bold]asyncrlhf ui[/] (open the runs link it prints for this experiment)")


@command()
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
    from pipelines.run.warmstart import write_start_checkpoint

    experiment = load(spec, set_)
    try:
        manifest = write_start_checkpoint(experiment, out)
    except ValueError as err:
        fail(err)
    evaluation = manifest["eval"]
    console.print(
        f"[green]wrote[/] {out}: {manifest['warm_start']['steps']} warm-start steps, final loss "
        f"{manifest['final_loss']:.4f} ({manifest['built_with']['cpu_capability']} kernels)\n"
        f"held-out greedy accuracy {evaluation['greedy_accuracy']:.3f} on {evaluation['eval_size']} "
        f"{evaluation['task']} problems\nsha256 {manifest['sha256']}",
        soft_wrap=True,
    )


app.command("chat-model")(chat_model)
