"""The task section of a spec, and what it builds: the task (2-digit addition, a JSONL
file of prompt/answer pairs, or a dataset file: JSONL or Parquet, read with Hugging Face
``datasets``, chat-templated), its reward, and how held-out answers are judged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from asyncrlhf.rewards import CompositeReward, DecodedReward, RewardTerm
from asyncrlhf.tasks import AdditionTask, JsonlTask
from asyncrlhf.tasks.dataset import DatasetTask
from pipelines.spec.files import _Section, when

__all__ = [
    "TaskSpec",
    "build_reward",
    "build_task",
    "counted_eval_problems",
    "eval_scorer",
    "model_context",
    "prompt_limit",
]


ADDITION, FILES, DATASET = when(kind=["addition"]), when(kind=["jsonl", "dataset"]), when(kind=["dataset"])


class TaskSpec(_Section):
    kind: Literal["addition", "jsonl", "dataset"] = Field(
        "addition", description="The verifiable task: 2-digit addition, a JSONL file, or a dataset file."
    )
    digits: int = Field(2, ge=1, le=6, description="Addition: digits per operand.", json_schema_extra=ADDITION)
    eval_size: int = Field(200, ge=1, description="Addition: held-out problems.")
    eval_seed: int = Field(
        0, ge=0, description="Seeds the held-out draw (addition) or split (JSONL); fixed across run seeds."
    )
    path: str | None = Field(
        None, description="JSONL: file of {prompt, answer} lines; dataset: .jsonl or .parquet.", json_schema_extra=FILES
    )
    eval_path: str | None = Field(
        None, description="JSONL, dataset: separate evaluation file (else a share).", json_schema_extra=FILES
    )
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="JSONL, dataset: share held out without eval_path.", json_schema_extra=FILES
    )
    answer_variants: bool = Field(
        False, description="JSONL, dataset: answers also match other (BPE) tokenizations.", json_schema_extra=FILES
    )
    prompt_key: str = Field(
        "prompt", min_length=1, description="dataset: the field holding the prompt.", json_schema_extra=DATASET
    )
    answer_key: str = Field(
        "answer",
        min_length=1,
        description="dataset: the field holding the reference answer.",
        json_schema_extra=DATASET,
    )
    system_prompt: str | None = Field(
        None, description="dataset: a system message (needs a chat template).", json_schema_extra=DATASET
    )
    chat_template: bool | None = Field(
        None, description="dataset: apply the tokenizer's chat template (null: if any).", json_schema_extra=DATASET
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="JSONL, dataset: longest prompt, in tokens (null: the model's context less "
        "rollout.max_new_tokens; more than that is refused).",
        json_schema_extra=FILES,
    )
    long_prompts: Literal["drop", "refuse"] = Field(
        "drop", description="JSONL, dataset: what a longer prompt gets.", json_schema_extra=FILES
    )

    @field_validator("eval_size")
    @classmethod
    def _eval_fits(cls, eval_size: int, info: ValidationInfo) -> int:
        pairs = 10 ** (2 * info.data.get("digits", 1))
        if eval_size > pairs // 4:
            raise ValueError(
                f"{info.data.get('digits')}-digit addition has {pairs} problems, of which at most a "
                f"quarter ({pairs // 4}) can be held out"
            )
        return eval_size

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.kind in ("jsonl", "dataset"):
            if self.path is None:
                raise ValueError(f"kind {self.kind!r} needs a path")
            for name in ("path", "eval_path"):
                value = getattr(self, name)
                if value is not None and not Path(value).is_file():
                    raise ValueError(f"{name} {value!r} does not exist")
        return self


def model_context(path: str) -> int | None:
    """The context length (``max_position_embeddings``) of the model at ``path``, read
    from its config alone; None when it has none."""
    from transformers import AutoConfig

    from pipelines.spec.trust import code_trusted

    config = AutoConfig.from_pretrained(path, trust_remote_code=code_trusted())
    return getattr(config, "max_position_embeddings", None)


def prompt_limit(spec: Any, context: int | None) -> int | None:
    """The longest prompt a file-backed task keeps: ``task.max_prompt_tokens``, else what
    the model's ``context`` (its ``max_position_embeddings``) leaves after the response.

    Raises:
        ValueError: ``max_prompt_tokens`` and ``rollout.max_new_tokens`` together exceed it.
    """
    new_tokens, asked = spec.rollout.max_new_tokens, spec.task.max_prompt_tokens
    budget = None if context is None else context - new_tokens
    if budget is not None and budget < 1:
        raise ValueError(
            f"rollout.max_new_tokens={new_tokens} leaves no room for a prompt in the model's context of {context}"
        )
    if asked is not None and budget is not None and asked > budget:
        raise ValueError(
            f"task.max_prompt_tokens={asked} and rollout.max_new_tokens={new_tokens} exceed the model's context of "
            f"{context} positions: at most {budget} tokens of prompt"
        )
    return asked if asked is not None else budget


def build_task(spec: Any, tokenizer: Any, context: int | None = None) -> Any:
    """The spec's verifiable task; ``context``: the model's, which bounds a file's prompts
    (:func:`prompt_limit`)."""
    if spec.task.kind == "addition":
        longest = 2 * spec.task.digits + 2 + 1  # "a+b=" and BOS
        limit = prompt_limit(spec, context)
        if limit is not None and longest > limit:
            raise ValueError(
                f"{spec.task.digits}-digit addition prompts ({longest} tokens) and rollout.max_new_tokens="
                f"{spec.rollout.max_new_tokens} exceed the model's context of {context} positions"
            )
        return AdditionTask(
            tokenizer,
            digits=spec.task.digits,
            seed=spec.seed,
            eval_size=spec.task.eval_size,
            eval_seed=spec.task.eval_seed,
        )
    task, limit = spec.task, prompt_limit(spec, context)
    if task.kind == "jsonl":
        return JsonlTask(
            tokenizer,
            task.path,
            task.eval_path,
            task.eval_fraction,
            seed=spec.seed,
            eval_seed=task.eval_seed,
            answer_variants=task.answer_variants,
            max_prompt_tokens=limit,
            long_prompts=task.long_prompts,
        )
    return DatasetTask(
        tokenizer,
        task.path,
        task.prompt_key,
        task.answer_key,
        task.eval_path,
        task.eval_fraction,
        task.system_prompt,
        task.chat_template,
        limit,
        task.long_prompts,
        seed=spec.seed,
        eval_seed=task.eval_seed,
        answer_variants=task.answer_variants,
    )


def counted_eval_problems(task: Any, on_data: Callable[[dict[str, int]], None] | None) -> list[Any]:
    """The task's held-out problems, their count and the prompts dropped told to ``on_data``."""
    held_out = task.eval_problems()
    if on_data is not None:
        on_data({"task/eval_problems": len(held_out), "task/dropped_prompts": getattr(task, "dropped", 0)})
    return held_out


def build_reward(spec: Any, tokenizer: Any) -> CompositeReward:
    """The spec's reward terms, summed; a ``decoded`` term holds ``tokenizer`` and starts
    its process pool where it first scores (in a Ray rollout actor: there)."""
    terms = []
    for term in spec.rewards:
        fn = None
        if term.kind == "decoded":
            fn = DecodedReward(
                tokenizer, term.scorer, term.workers, term.timeout_s, term.timeout_score, term.error_score
            )
        terms.append(RewardTerm(term.kind, term.weight, fn=fn))
    return CompositeReward(terms)


def eval_scorer(reward: CompositeReward) -> Any:
    """How held-out answers are judged: by the first decoded term's verifier if the
    reward has one (worked answers are not matched token for token), else exact match."""
    return next((term.fn for term in reward.terms if term.kind == "decoded"), None)
