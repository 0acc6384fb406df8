"""The command line's shared parts: the Typer app, the consoles, and the one way bad input
ends (:func:`fail`: one line on stderr, exit 2), which :func:`command` applies to every
command's refusals."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from pipelines.spec import ExperimentSpec, SpecError, load_spec, spec_from_dict
from pipelines.spec.files import apply_overrides
from pipelines.spec.trust import TRUST_ENV

__all__ = ["ForceOpt", "SetOpt", "SpecArg", "TrustOpt", "app", "command", "console", "errors", "fail", "load", "trust"]

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Asynchronous RL post-training experiments.")
console = Console() if Console().is_terminal else Console(width=140)  # logs: no 80-column cut
errors = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 400)

SpecArg = Annotated[Path, typer.Argument(help="Experiment YAML file.", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a field: key.path=value (repeatable).")]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-code",
        help=f"Run the code the spec names (plugins, 'module:function' rewards and scorers, a model's custom code): "
        f"refused without it. {TRUST_ENV}=1 does the same.",
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Resume even if the spec is not the one the checkpoint was written with.")
]


def trust(on: bool) -> None:
    """``--trust-code``: this process, and every one it starts (Ray's workers, trials), trust the spec's code."""
    if on:
        os.environ[TRUST_ENV] = "1"


def fail(message: object) -> NoReturn:
    """Bad input: one line on stderr naming it, exit 2."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


def command(name: str | None = None, refuse: tuple[type[BaseException], ...] = ()) -> Callable[..., Any]:
    """``app.command``, the command's bad input (a :class:`SpecError` anywhere in it, and
    the ``refuse`` kinds) ending in :func:`fail`."""
    kinds = (SpecError, *refuse)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def refusing(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except kinds as err:
                fail(err)

        return app.command(name)(refusing)

    return register


def load(spec_path: Path | None, overrides: list[str] | None) -> ExperimentSpec:
    """The spec at ``spec_path`` (None: the defaults) with overrides."""
    if spec_path is None:
        return spec_from_dict(apply_overrides({}, overrides or []), source="--set")
    return load_spec(spec_path, overrides or [])
