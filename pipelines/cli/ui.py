"""``asyncrlhf ui``: the MLflow UI for the local store."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.app import command, console, fail


@command()
def ui(
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 5000,
    host: Annotated[str, typer.Option(help="Interface to bind (local only by default).")] = "127.0.0.1",
    uri: Annotated[str | None, typer.Option(help="Tracking store (default: as for `run`).")] = None,
) -> None:
    """Serve the MLflow UI for the local store (runs whose process died are marked KILLED first)."""
    from pipelines.run.processes import port_in_use, serve
    from pipelines.tracking import open_store, resolve_tracking_uri, tag_experiments
    from pipelines.tracking.names import GROUPED_VIEW_KEY, VIEW_KEY, experiment_url

    if port_in_use(host, port):  # before any link is printed: the server would fail, and exit 0
        fail(f"--port {port} on {host} is in use: choose another with --port")
    store = resolve_tracking_uri(uri)
    experiments = tag_experiments(open_store(store))  # initialised and reconciled first (a damaged one refused)
    mlflow_bin = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    command = [mlflow_bin, "ui", "--backend-store-uri", store, "--host", host, "--port", str(port)]
    base = f"http://{host}:{port}"
    console.print(f"MLflow UI for {store} on {base} (Ctrl-C to stop); its experiments' runs:", soft_wrap=True)
    for experiment in experiments[:10]:  # each in the Model-training layout, with its saved view
        view = VIEW_KEY if f"mlflow.sharedViewState.{VIEW_KEY}" in experiment.tags else None
        console.print(f"  {experiment.name}: {experiment_url(base, experiment.experiment_id, view)}", soft_wrap=True)
        if f"mlflow.sharedViewState.{GROUPED_VIEW_KEY}" in experiment.tags:  # a sweep's
            grouped = experiment_url(base, experiment.experiment_id, GROUPED_VIEW_KEY)
            console.print(f"  {experiment.name}, trials by configuration: {grouped}", soft_wrap=True)
    raise typer.Exit(serve(command))
