"""Run one experiment spec: build everything from it, train, track in MLflow."""

from __future__ import annotations

import contextlib
import copy
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrlhf.models import TinyModelConfig, WarmStartConfig, load_pretrained, load_tokenizer, pretrained_policy
from asyncrlhf.orchestration import HeldOut, Orchestrator, RunConfig, RunHistory, Runtime
from asyncrlhf.rollout import HFEngine, VLLMEngine
from asyncrlhf.training import TrainerWorker
from asyncrlhf.training.lora import write_adapter
from pipelines.run.checkpoint_store import CheckpointError, Checkpoints, check_resume, checkpoint_folder, resume_key
from pipelines.run.layout import check_lora, ray_layout
from pipelines.run.processes import InterruptedBeforeRun, RunInterrupted, shielded, stop_on_signals, stop_requested
from pipelines.spec import ExperimentSpec
from pipelines.spec.files import SpecError
from pipelines.spec.memory import check_fits
from pipelines.spec.plugins import import_plugins
from pipelines.spec.tasks import build_reward, build_task, counted_eval_problems, eval_scorer, model_context
from pipelines.spec.trust import code_trusted

__all__ = [
    "RunResult",
    "build_reward",
    "build_runtime",
    "check_resume",
    "resume_key",
    "run_experiment",
    "seed_everything",
    "tiny_configs",
]

MetricsCallback = Callable[[int, dict[str, float]], None]


@dataclass
class RunResult:
    """What a finished run returns."""

    run_id: str | None
    final_metrics: dict[str, float]
    history: RunHistory
    tracking_uri: str | None = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _device(spec: ExperimentSpec) -> str:
    if spec.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec.model.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device is 'cuda' but no CUDA device is available")
    return spec.model.device


def _policy_path(spec: ExperimentSpec) -> str:
    if spec.model.kind == "pretrained":
        assert spec.model.path is not None
        return spec.model.path
    return str(pretrained_policy(*tiny_configs(spec)))


def tiny_configs(spec: ExperimentSpec) -> tuple[TinyModelConfig, WarmStartConfig]:
    """The core configs of the spec's tiny model and its warm start."""
    model = spec.model
    tiny = TinyModelConfig(
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
    )
    digits = spec.task.digits if spec.task.kind == "addition" else 2
    warm = WarmStartConfig(
        digits=digits,
        steps=model.warm_start.steps,
        batch_size=model.warm_start.batch_size,
        lr=model.warm_start.lr,
        seed=model.warm_start.seed,
    )
    return tiny, warm


def _trainer(spec: ExperimentSpec, model: Any, tokenizer: Any) -> TrainerWorker:
    """The trainer; one rank of a trainer group (a ``ShardedTrainer``) when the spec asks for ranks."""
    algo = spec.algorithm
    cls, extra = TrainerWorker, {}
    if spec.runtime.kind == "ray" and spec.runtime.trainer.ranks > 1:
        from asyncrlhf.training.sharded import ShardedTrainer

        cls, extra = ShardedTrainer, {"parallel": spec.runtime.trainer.parallel}
    ref_model = copy.deepcopy(model) if algo.uses_reference else None
    if spec.model.lora is not None:  # on a copy: the local engine copies the base model
        from asyncrlhf.training.lora import LoraSettings, apply_lora

        model = apply_lora(copy.deepcopy(model), LoraSettings(**spec.model.lora.model_dump()))
    options = algo.loss_options()
    if options.get("loss_agg") == "seq-mean-token-sum-norm":
        options["norm_length"] = spec.rollout.max_new_tokens  # Dr. GRPO's constant: the generation budget
    return cls(
        model,
        tokenizer.pad_token_id,
        algo.name,
        options,
        spec.trainer.to_optim(),
        temperature=spec.rollout.temperature,
        ref_model=ref_model,
        seed=spec.seed,
        skip_zero_advantage=spec.trainer.skip_zero_advantage,
        share_prompts=spec.trainer.share_prompts,
        **extra,
    )


def _engine(
    spec: ExperimentSpec, model: Any, tokenizer: Any, path: str, device: str, worker: int = 0, copy_model: bool = True
) -> Any:
    """The rollout engine; HF engines copy ``model`` unless told it is theirs alone."""
    rollout, seed = spec.rollout, spec.seed + 1 + worker  # each worker its own sampling stream
    if rollout.engine == "vllm":
        return VLLMEngine(path, rollout.to_sampling(), seed=seed, **rollout.vllm)
    return HFEngine(
        model,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        rollout.to_sampling(),
        seed=seed,
        device=device,
        copy=copy_model,
    )


def build_runtime(
    spec: ExperimentSpec,
    on_metrics: MetricsCallback | None = None,
    on_table: Callable[..., None] | None = None,
    on_data: Callable[[dict[str, int]], None] | None = None,
) -> Runtime:
    """Model, task, engine, reward, trainer and runtime, all from the spec.

    ``runtime.kind: local`` gives an :class:`Orchestrator` (threads in this process);
    ``ray`` gives a :class:`~asyncrlhf.distributed.RayOrchestrator`, whose actors build
    their own engine and trainer from the same spec (Ray must be initialised).
    ``on_table(step, rows)`` gets each evaluation's first ``tracking.eval_samples``
    problems, decoded (prompt, answer, output, correct); ``on_data`` the data's counts
    (``task/eval_problems``, ``task/dropped_prompts``: over ``task.max_prompt_tokens``).
    """
    seed_everything(spec.seed)
    local = spec.runtime.kind == "local"
    path = _policy_path(spec)
    check_lora(spec, path)
    if spec.runtime.torch_threads is not None and local:
        torch.set_num_threads(spec.runtime.torch_threads)
    if local:
        device = _device(spec)
        model, tokenizer = load_pretrained(path, device, spec.model.torch_dtype, code_trusted())
        context = getattr(model.config, "max_position_embeddings", None)
    else:
        tokenizer, context = load_tokenizer(path, code_trusted()), model_context(path)
    task, reward = build_task(spec, tokenizer, context), build_reward(spec, tokenizer)
    held_out = counted_eval_problems(task, on_data)
    config = RunConfig(
        spec.to_schedule(),
        task.train_problems(),
        reward,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        held_out=HeldOut(held_out, spec.rollout.max_new_tokens, eval_scorer(reward)),
        advantage=spec.algorithm.advantage,
        timeout_s=spec.orchestrator.timeout_s,
        on_metrics=on_metrics,
        on_eval=_on_eval(spec, held_out, tokenizer, on_table),
    )
    if local:
        trainer = _trainer(spec, model, tokenizer)
        engine = _engine(spec, model, tokenizer, path, device)  # a copy of the trainer's model
        return Orchestrator(engine, trainer, config)
    from asyncrlhf.distributed import RayOrchestrator

    trusted = code_trusted()  # decided here, where the spec was checked: an actor's environment may differ
    engines = functools.partial(_actor_engine, spec, path, trusted)
    trainers = functools.partial(_actor_trainer, spec, path, trusted)
    return RayOrchestrator(engines, trainers, config, ray_layout(spec))


def _on_eval(spec: ExperimentSpec, problems: list[Any], tokenizer: Any, on_table: Callable[..., None] | None) -> Any:
    from pipelines.tracking.evaltable import table_callback

    return None if on_table is None else table_callback(problems, tokenizer, spec.tracking.eval_samples, on_table)


def _actor_engine(spec: ExperimentSpec, path: str, trusted: bool, worker: int) -> Any:
    """Inside a rollout actor: its own model (vLLM loads the path itself); ``trusted``: the driver's."""
    import_plugins(spec.plugins)  # their reward terms
    seed_everything(spec.seed + 1 + worker)
    device = _device(spec)
    if spec.rollout.engine == "vllm":
        return _engine(spec, None, None, path, device, worker)
    model, tokenizer = load_pretrained(path, device, spec.model.torch_dtype, trusted)
    return _engine(spec, model, tokenizer, path, device, worker, copy_model=False)


def _actor_trainer(spec: ExperimentSpec, path: str, trusted: bool) -> TrainerWorker:
    """Inside the trainer actor."""
    import_plugins(spec.plugins)  # their losses and estimators
    seed_everything(spec.seed)
    model, tokenizer = load_pretrained(path, _device(spec), spec.model.torch_dtype, trusted)
    return _trainer(spec, model, tokenizer)


def _fan(*callbacks: Callable[..., None] | None) -> Callable[..., None] | None:
    """One callback calling each given one in turn (None when none is given)."""
    given = [cb for cb in callbacks if cb is not None]

    def call(*args: Any) -> None:
        for callback in given:
            callback(*args)

    return call if given else None


def run_experiment(
    spec: ExperimentSpec,
    on_metrics: MetricsCallback | None = None,
    track: bool = True,
    resume: str | None = None,
    checkpoint_dir: str | Path | None = None,
    restore: bool = False,
    on_table: Callable[[int, dict[str, list[Any]]], None] | None = None,
    force_resume: bool = False,
) -> RunResult:
    """Build, run and track one experiment; or continue run ``resume`` from its last
    checkpoint (same spec but for ``trainer.steps``). ``on_metrics`` and ``on_table``
    get what the run's tracker gets: each step's metrics, each evaluation's table rows.

    Everything is built (and a resume checked) before the MLflow run is created or
    reopened, so bad input leaves no run behind; once the run exists, any failure marks
    it FAILED with the error. Checkpoints go beside the store (or ``checkpoint_dir``);
    ``restore`` continues from the newest one in ``checkpoint_dir`` (an untracked run,
    e.g. a sweep trial whose MLflow run the sweep driver keeps).
    """
    from pipelines.tracking import Tracker

    if resume is not None and not track:
        raise ValueError("resume needs tracking (the run to continue is an MLflow run)")
    check_fits(spec)  # sizes that cannot fit are refused before anything starts
    store = check_resume(spec, resume, force_resume) if resume is not None else None
    tracker: Any = False  # not yet built: an interrupt while a new store is created is one before the run
    try:
        tracker = Tracker(spec.tracking) if track else None
        fan_out = _fan(tracker.on_metrics if tracker else None, on_metrics)
        with contextlib.ExitStack() as stack:
            # torch threads are process-wide: the caller gets its own back
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            if spec.runtime.kind == "ray":
                from asyncrlhf.distributed import ray_runtime

                where = spec.runtime
                stack.enter_context(ray_runtime(where.address, where.num_cpus, where.num_gpus))
            try:
                tables, data = _fan(tracker.on_eval_rows if tracker else None, on_table), {}
                runtime = build_runtime(spec, on_metrics=fan_out, on_table=tables, on_data=data.update)
            except (ValueError, OSError) as err:  # the spec's data or model cannot be used: no run exists yet
                raise SpecError(f"{type(err).__name__}: {err}" if isinstance(err, OSError) else str(err)) from err
            stack.callback(_closing, runtime)  # actors, a decoded reward's pool
            run_id, store, begun = _open_run(spec, runtime, tracker, store, resume, checkpoint_dir, restore, stack)
            if tracker is not None and resume is None:
                tracker.log_opening_figures(data)  # whole-run figures known at the start, at step 0
            history, extra = _train(spec, runtime, store, tracker, begun)
    except KeyboardInterrupt:
        if tracker is False or (tracker is not None and tracker.run_id is None):
            raise InterruptedBeforeRun("before the MLflow run was created: nothing was logged") from None
        raise
    final = history.final()
    final.update(extra)
    return RunResult(run_id, final, history, tracker.uri if tracker else None)


def _closing(runtime: Runtime) -> None:
    """Close the runtime whatever signals come meanwhile (a cut join left its thread running at exit)."""
    with shielded(reraise=False):
        runtime.close()


def _open_run(
    spec: ExperimentSpec,
    runtime: Runtime,
    tracker: Any,
    store: Checkpoints | None,
    resume: str | None,
    checkpoint_dir: str | Path | None,
    restore: bool,
    stack: contextlib.ExitStack,
) -> tuple[str | None, Checkpoints | None, int]:
    """Restore an untracked run from ``checkpoint_dir``, reopen run ``resume`` from its
    checkpoints, or create a new run; its id, its checkpoint store (whose lock ``stack``
    then holds while the run trains: no second process may train it meanwhile) and the
    step it begins from (that of the checkpoint restored, or 0)."""
    if restore and checkpoint_dir is not None:
        store = Checkpoints(checkpoint_dir, spec.trainer.keep_checkpoints)
        state, manifest = store.load_latest()
        if manifest["spec_hash"] != resume_key(spec):
            raise CheckpointError(f"{store.folder}: the checkpoint is of another experiment")
        runtime.restore(state)
        return None, store, manifest["step"]
    if store is not None:
        stack.enter_context(store.lock())
        state, manifest = store.load_latest()
        runtime.restore(state)
        tracker.resume(resume, manifest["step"], state["record"]["steps"])
        return resume, store, manifest["step"]
    run_id = tracker.start(spec) if tracker else None
    with tracker.failing() if tracker else contextlib.nullcontext():
        folder = checkpoint_dir or (checkpoint_folder(tracker.uri, run_id) if tracker and run_id else None)
        if folder is not None and spec.trainer.checkpoint_every:
            store = Checkpoints(folder, spec.trainer.keep_checkpoints)
            stack.enter_context(store.lock())
    return run_id, store, 0


def _train(
    spec: ExperimentSpec, runtime: Runtime, store: Checkpoints | None, tracker: Any, begun: int
) -> tuple[Any, dict]:
    """Run from step ``begun`` (checkpointed, if not 0) to the end, checkpointing when due
    and on a stop request; finish or fail the run. A run restored at its end (stopped
    during its final upload) trains nothing and is only finished."""
    every, key, done = spec.trainer.checkpoint_every, resume_key(spec), {"step": begun or -1}

    def checkpoint() -> None:
        def write(state: dict[str, Any]) -> None:  # labelled by its own step (Ray may be one ahead)
            store.save(state, state["steps_done"], key)  # type: ignore[union-attr]
            done["step"] = state["steps_done"]

        runtime.checkpoint(write)

    with tracker.failing() if tracker else contextlib.nullcontext():
        with stop_on_signals() as requested:

            def after_step(step: int) -> None:
                if not requested and stop_requested():  # a signal whose interrupt was lost during start-up
                    requested.append(str(stop_requested()))
                if store is not None and ((every and step % every == 0) or requested):
                    checkpoint()
                if requested:
                    raise RunInterrupted(f"{requested[0]}: stopped after step {step}")

            start = time.perf_counter()
            history = runtime.run(spec.trainer.steps, after_step)
            wall = time.perf_counter() - start
        if store is not None and done["step"] != spec.trainer.steps:
            checkpoint()  # the end too: a finished run can be continued
        # Per-step tracking cost as a share of the run (the < 5% budget); the one-off
        # cost of plots and artifacts at the end is reported separately.
        extra = {}
        if tracker:  # and as CPU time of the loop's thread, which a loaded machine does not inflate
            loop_cpu = max(history.summary.get("time/loop_cpu_s", 0.0), 1e-9)
            extra = {
                "perf/tracking_frac": tracker.step_seconds / wall,
                "perf/tracking_cpu_frac": tracker.step_cpu_seconds / loop_cpu,
            }
        if store is not None:
            extra["perf/checkpoint_frac"] = store.seconds / wall
        if tracker:
            _log_policy(spec, runtime, tracker)
            tracker.finish(history, extra)
            extra["time/tracking_finish_s"] = tracker.finish_seconds
    return history, extra


def _log_policy(spec: ExperimentSpec, runtime: Runtime, tracker: Any) -> None:
    """The trained policy as the run's output: ``policy/`` in the Hugging Face layout
    (weights and tokenizer), loadable with ``model.kind: pretrained``."""
    import tempfile

    path = _policy_path(spec)
    model, tokenizer = load_pretrained(path, dtype=spec.model.torch_dtype, trust_remote_code=code_trusted())
    model.load_state_dict(runtime.policy_state())
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-policy-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tracker.client.log_artifacts(tracker.run_id, tmp, "policy")
    adapter = runtime.adapter()
    if adapter is not None:  # LoRA: the adapter alone too, as peft saves it (policy/ is merged)
        with tempfile.TemporaryDirectory(prefix="asyncrlhf-adapter-") as tmp:
            write_adapter(adapter, tmp)
            tracker.client.log_artifacts(tracker.run_id, tmp, "adapter")
