"""A run's checkpoints on disk: atomic, checksummed, the last few kept.

``<store>/checkpoints/<run_id>/step-000100/`` holds ``state.pt`` (the orchestrator's
checkpoint, read back with ``torch.load(weights_only=True)``), the folders the runtime
attached to it (a trainer group's sharded model and optimiser, ``trainer/``) and
``manifest.json`` (step, spec hash, SHA-256 of every file). A checkpoint is written into a temporary folder
and renamed into place, so a crash never leaves a half-written one under its final
name; loading verifies the checksum and falls back to the previous checkpoint, with a
warning, when the newest is truncated or corrupted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pipelines.spec.files import SpecError, flatten, spec_hash
from pipelines.tracking.signals import shielded

if TYPE_CHECKING:
    from pipelines.spec import ExperimentSpec

__all__ = ["CheckpointError", "Checkpoints", "check_resume", "checkpoint_folder", "resume_key"]


class CheckpointError(RuntimeError):
    """No usable checkpoint (none written, or every one corrupted)."""


def checkpoint_folder(tracking_uri: str, run_id: str) -> Path:
    """Beside a local SQLite store (``mlflow/checkpoints/<run_id>``), else under ``./mlflow``."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "checkpoints" / run_id
    return Path("mlflow") / "checkpoints" / run_id


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Checkpoints:
    """The checkpoints of one run, in ``folder``; ``keep`` newest are kept."""

    def __init__(self, folder: str | Path, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.keep = keep
        self.seconds = 0.0  # time spent writing, for the cost figure

    def steps(self) -> list[int]:
        """Steps with a (complete, renamed-into-place) checkpoint, oldest first."""
        if not self.folder.is_dir():
            return []
        names = (p.name for p in self.folder.iterdir() if p.is_dir() and p.name.startswith("step-"))
        return sorted(int(name.removeprefix("step-")) for name in names if name.removeprefix("step-").isdigit())

    def save(self, state: dict[str, Any], step: int, spec_hash: str) -> Path:
        """Write ``state`` as the checkpoint of ``step``, atomically; prune old ones. A
        signal meanwhile waits for the write's end (a second Ctrl-C inside ``torch.save``
        surfaced as ``RuntimeError: unexpected pos`` and failed the run)."""
        with shielded():
            return self._save(state, step, spec_hash)

    def _save(self, state: dict[str, Any], step: int, spec_hash: str) -> Path:
        begin = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"step-{step:06d}"
        tmp = self.folder / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            state, hashes = _attach(dict(state), tmp)
            with open(tmp / "state.pt", "wb") as handle:  # ours: torch's own file hides the OS error
                torch.save(state, handle)
            manifest = {
                "step": step,
                "spec_hash": spec_hash,
                "sha256": {"state.pt": _sha256(tmp / "state.pt"), **hashes},
                "created": time.time(),
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        except Exception as err:  # a full disk, a file size limit: no partial checkpoint stays
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(err, self.folder, step) from err
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.steps()[: -self.keep]:
            shutil.rmtree(self.folder / f"step-{old:06d}", ignore_errors=True)
        self.seconds += time.perf_counter() - begin
        return final

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Held while a process trains from (and writes) these checkpoints: a second
        process resuming the same run is refused, not let into the same run."""
        from filelock import FileLock, Timeout

        self.folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.folder / ".lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise CheckpointError(f"{self.folder}: another process is training this run (it holds .lock)") from None
        try:
            for stale in self.folder.glob(".step-*.tmp-*"):  # a write killed midway (no one else writes here now)
                shutil.rmtree(stale, ignore_errors=True)
            yield
        finally:
            lock.release()

    def latest_manifest(self) -> dict[str, Any] | None:
        """The newest checkpoint's manifest (step, spec hash, checksums), without loading
        its state; None when there is none or it cannot be read."""
        steps = self.steps()
        try:
            return json.loads((self.folder / f"step-{steps[-1]:06d}" / "manifest.json").read_text()) if steps else None
        except (OSError, ValueError):
            return None

    def refuse_code(self) -> None:
        """Refuse the whole store if any checkpoint's trainer shards name code (their
        ``.metadata`` pickles are read with DCP's classes only admitted): a tampered
        checkpoint is not skipped for an older one, it stops the resume.

        Raises:
            CheckpointError: naming the file and what it names.
        """
        from asyncrlhf.training.safe_dcp import UnsafeCheckpointError, read_metadata

        for step in self.steps():
            for path in sorted((self.folder / f"step-{step:06d}").rglob("*.metadata")):
                try:
                    read_metadata(path)
                except UnsafeCheckpointError as err:
                    raise CheckpointError(f"refused: {err}") from None

    def load_latest(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state, manifest)`` of the newest checkpoint that verifies; an older one,
        with a warning, when the newest is damaged.

        Raises:
            CheckpointError: no checkpoint, or none usable.
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.folder}")
        self.refuse_code()
        problems = []
        for step in reversed(steps):
            folder = self.folder / f"step-{step:06d}"
            try:
                manifest = json.loads((folder / "manifest.json").read_text())
                for name, digest in manifest["sha256"].items():
                    if _sha256(folder / name) != digest:
                        raise ValueError(f"{name} does not match its SHA-256")
                state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
                if "attachments" in state:
                    state["attachments"] = {name: str(folder / name) for name in state["attachments"]}
            except Exception as err:  # truncated, corrupted, half-deleted: try the previous one
                problems.append(f"step {step}: {type(err).__name__}: {err}")
                warnings.warn(f"checkpoint {folder} is unusable ({err}); trying the previous one", stacklevel=2)
                continue
            return state, manifest
        raise CheckpointError(f"no usable checkpoint in {self.folder}: " + "; ".join(problems))


def _attach(state: dict[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Move the folders a runtime wrote for this checkpoint (``state["attachments"]``:
    name → path, a sharded trainer's shards) into ``folder``; the state names them
    relative to it, and the SHA-256 of every file they hold goes into the manifest."""
    hashes: dict[str, str] = {}
    attachments = state.get("attachments")
    if not attachments:
        return state, hashes
    for name, source in attachments.items():
        shutil.move(source, folder / name)
        for path in sorted((folder / name).rglob("*")):
            if path.is_file():
                hashes[str(path.relative_to(folder))] = _sha256(path)
    state["attachments"] = {name: name for name in attachments}
    return state, hashes


def _write_error(err: Exception, folder: Path, step: int) -> Exception:
    """The OS error under a failed checkpoint write (torch reports ``unexpected pos`` or
    ``iostream error`` for a full disk), as one naming the folder and the step."""
    from pipelines.tracking.integrity import cause_of

    cause = cause_of(err, OSError)
    if cause is None:
        return err
    return OSError(cause.errno, f"cannot write the checkpoint of step {step} in {folder}: {cause.strerror or cause}")


def resume_key(spec: ExperimentSpec) -> str:
    """What a checkpoint must match to be resumed: the spec but for its number of steps
    and where it is tracked."""
    from pipelines.spec import TrackingSpec

    trainer = spec.trainer.model_copy(update={"steps": 0})
    return spec_hash(spec.model_copy(update={"trainer": trainer, "tracking": TrackingSpec()}))


def _check_checkpointed_spec(
    spec: ExperimentSpec, run_id: str, logged: dict[str, str], now: dict[str, str], store: Checkpoints, force: bool
) -> None:
    """The spec is the one the newest checkpoint was written with (its hash in the
    manifest): an edited ``spec.yaml`` is refused, or, with ``force``, warned about."""
    manifest = store.latest_manifest()
    if manifest is None or manifest.get("spec_hash") == resume_key(spec):
        return
    differing = [  # against the spec as the run started (its params, flattened)
        f"{k} ({logged[k]} → {v})"
        for k, v in sorted(now.items())
        if k in logged and logged[k] != v and not may_change_on_resume(k)
    ]
    message = (
        f"--resume {run_id}: the spec is not the one its checkpoint of step {store.steps()[-1]} was written with "
        f"(was its spec.yaml edited?){': ' + ', '.join(differing) if differing else ''}"
    )
    if not force:
        raise SpecError(f"{message}; --force resumes it anyway")
    warnings.warn(f"{message}; resuming anyway (--force)", stacklevel=3)


def may_change_on_resume(key: str) -> bool:
    """A spec field a resumed run may change: its length, where it is tracked, how the
    trainer is laid out (its shards are resharded onto the new ranks) and the cluster it
    runs on (more ranks may need more CPUs)."""
    cluster = ("runtime.address", "runtime.num_cpus", "runtime.num_gpus")
    return key == "trainer.steps" or key in cluster or key.startswith(("tracking.", "runtime.trainer."))


def _refuse_code(store: Checkpoints, run_id: str) -> None:
    try:
        store.refuse_code()
    except CheckpointError as err:
        raise SpecError(f"--resume {run_id}: {err}") from None


def check_resume(spec: ExperimentSpec, run_id: str, force: bool = False) -> Checkpoints:
    """The checkpoints of ``run_id`` if ``spec`` may continue it; else a SpecError naming
    why (unknown run, another experiment, a changed spec, nothing left to run). The spec
    is also checked against the one its newest checkpoint was written with (its hash in
    the manifest), so an edited ``spec.yaml`` is not trusted; ``force`` resumes anyway,
    warning with the difference."""
    from pipelines.spec import spec_from_dict
    from pipelines.tracking import open_store, read_run, resolve_tracking_uri
    from pipelines.tracking.store import live_owner

    uri = resolve_tracking_uri(spec.tracking.uri)
    try:
        run, old, experiment = read_run(open_store(uri), run_id)
    except LookupError as err:
        raise SpecError(f"--resume: {err}") from None
    owner = live_owner(run.data.tags) if run.info.status == "RUNNING" else None
    if owner is not None:  # two processes would train and log into one run
        raise SpecError(
            f"--resume {run_id}: the run is still training in {owner}: stop it first (Ctrl-C or "
            "SIGTERM checkpoints it), then resume it"
        )
    if experiment != spec.tracking.experiment:
        raise SpecError(
            f"--resume {run_id}: the run is in experiment {experiment!r}, the spec logs to {spec.tracking.experiment!r}"
        )
    before, now = flatten(spec_from_dict(old, source=f"run {run_id}")), flatten(spec)
    # Where and how it is tracked is not the experiment (the experiment name is checked above).
    changed = [
        f"{k} ({before.get(k)} → {now.get(k)})"
        for k in sorted(set(before) | set(now))
        if not may_change_on_resume(k) and before.get(k) != now.get(k)
    ]
    if changed:
        raise SpecError(
            f"--resume {run_id}: only trainer.steps, runtime.trainer (ranks, parallel, placement, resources) "
            f"and the cluster (runtime.address, num_cpus, num_gpus) may change, but {', '.join(changed)}"
        )
    ranks = (int(before.get("runtime.trainer.ranks", "1")), spec.runtime.trainer.ranks)  # flattened: strings
    if spec.model.lora is not None and ranks[0] == 1 and ranks[1] > 1:
        raise SpecError(
            f"--resume {run_id}: runtime.trainer.ranks={ranks[1]}: a one-process LoRA checkpoint does not "
            "resume onto a trainer group (a group's resumes onto any number of ranks): keep ranks=1"
        )
    store = Checkpoints(checkpoint_folder(uri, run_id), spec.trainer.keep_checkpoints)
    steps = store.steps()
    if not steps:
        raise SpecError(f"--resume {run_id}: the run has no checkpoint in {store.folder}")
    _refuse_code(store, run_id)  # before anything is built
    # A run checkpointed at its last step but not FINISHED stopped during its final upload:
    # resuming it with the same steps finishes it (metrics, plots, policy), training nothing.
    unfinished_end = spec.trainer.steps == steps[-1] and run.info.status != "FINISHED"
    if spec.trainer.steps <= steps[-1] and not unfinished_end:
        what = "finished" if run.info.status == "FINISHED" else "is checkpointed at"
        raise SpecError(
            f"--resume {run_id}: the run {what} step {steps[-1]} and trainer.steps={spec.trainer.steps}:"
            f" raise it (--set trainer.steps={2 * steps[-1]}) to continue"
        )
    _check_checkpointed_spec(spec, run_id, run.data.params, now, store, force)
    return store
