"""The ``asyncrlhf`` command line (Typer): the app and its error handling (:mod:`.app`),
and a module per group of commands, each registering its own."""

from pipelines.cli import bench, run, sweep, ui  # noqa: F401  (each registers its commands)
from pipelines.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
