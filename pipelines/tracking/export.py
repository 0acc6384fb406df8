"""``asyncrlhf export``: a run's trained policy copied out of the store, touching nothing
but the target directory."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["ExportError", "export_policy"]


class ExportError(Exception):
    """The export cannot be done as asked; nothing was written."""


def export_policy(run_id: str, out: str | Path, uri: str | None = None, overwrite: bool = False) -> Path:
    """Copy run ``run_id``'s ``policy/`` artifact (Hugging Face layout) to ``out``.

    The policy is downloaded into a new hidden sibling of ``out`` and renamed into place:
    nothing but ``out`` is ever touched (downloading into ``out``'s parent used to merge
    with a folder named ``policy`` there and rename it away), and a failed download leaves
    nothing behind. An existing non-empty ``out`` is refused unless ``overwrite``; then it
    is replaced only once the new policy is complete, and put back if that fails.
    """
    from pipelines.tracking import open_store

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"--out {out} exists and is not empty: give a new directory, or --overwrite")
    client = open_store(uri)  # a damaged store is its own error (StoreError), before anything is made
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        try:
            policy = Path(client.download_artifacts(run_id, "policy", str(staging)))
        except Exception as err:
            raise ExportError(f"run {run_id!r} has no policy to export ({type(err).__name__})") from None
        previous = staging / "previous" if out.exists() else None
        if previous is not None:
            out.rename(previous)
        try:
            policy.rename(out)
        except OSError:
            if previous is not None:
                previous.rename(out)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
