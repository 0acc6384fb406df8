"""The ``asyncrlhf`` command line (Typer): the app and its error handling (:mod:`.app`),
and a module per group of commands, each registering its own."""

from pipelines.cli import bench, run, sweep, ui  # noqa: F401  (each registers its commands)
from pipelines.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """The console script: the app, then an exit no late signal can turn into a death by
    signal. The second of two Ctrl-C's landing after the run was marked KILLED ended the
    process by SIGINT rather than with its code 130; and an interrupted run's process
    could abort in interpreter teardown ("terminate called without an active exception",
    a native thread's destructor) after its state was recorded. An interrupted command
    (130, 143) has recorded everything by then, so it leaves without that teardown."""
    import logging
    import os
    import signal
    import sys

    code: int | str | None = 0
    try:
        app()
    except SystemExit as stop:
        code = stop.code
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    if code in (130, 143):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
