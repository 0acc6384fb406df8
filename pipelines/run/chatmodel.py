"""A real model directory built here: a byte-level BPE tokenizer trained on a dataset
(digits split one by one, as Qwen's and Llama 3's are) with a ChatML template, a small
Qwen2 model from a config, a short supervised warm start on the dataset's worked
answers through that template, all saved with ``save_pretrained``. A run then loads it
like any downloaded checkpoint (``model.kind: pretrained``)::

    asyncrlhf chat-model --out models/word-problems
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

__all__ = ["CHAT_TEMPLATE", "build_chat_model", "chat_model", "train_tokenizer"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DATA = Path("experiments/data/word_problems")


def train_tokenizer(texts: list[str], vocab_size: int = 400) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``: ``<|im_end|>``
    ends a turn (EOS), ``<|endoftext|>`` pads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_chat_model(
    out: Path,
    train: Path,
    test: Path,
    steps: int = 1100,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    prompt_key: str = "question",
    answer_key: str = "answer",
) -> dict[str, Any]:
    """Tokenizer, Qwen2 model and warm start into ``out``; the manifest (data checksums,
    sizes, the warm start's held-out greedy accuracy under the math verifier)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    from asyncrlhf.models import fit_answers
    from asyncrlhf.orchestration.evaluate import evaluate, greedy_engine
    from asyncrlhf.rewards import DecodedReward
    from asyncrlhf.tasks.dataset import DatasetTask

    if out.exists():
        raise ValueError(f"--out {out} already exists: choose a new directory (nothing is overwritten)")
    records = [json.loads(line) for line in train.read_text().splitlines() if line.strip()]
    tokenizer = train_tokenizer([r[prompt_key] + "\n" + r[answer_key] for r in records])
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    task = DatasetTask(tokenizer, train, prompt_key, answer_key, eval_path=test, seed=seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    losses = fit_answers(model, task.train_problems(), eos, pad, steps, batch_size, lr)
    engine = greedy_engine(model, eos, pad, max_new_tokens=24)
    accuracy = evaluate(engine, task.eval_problems(), eos, pad, scorer=DecodedReward(tokenizer, workers=0)).accuracy
    staged = out.with_name(out.name + ".partial")
    hf_logging.disable_progress_bar()
    model.save_pretrained(staged)
    tokenizer.save_pretrained(staged)
    manifest = {
        "architecture": "Qwen2ForCausalLM",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "data": {str(p): hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in (train, test)},
        "warm_start": {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "final_loss": losses[-1]},
        "eval": {"problems": len(task.eval_problems()), "greedy_accuracy": accuracy, "judge": "math verifier"},
    }
    (staged / "asyncrlhf.json").write_text(json.dumps(manifest, indent=1))
    staged.rename(out)
    return manifest


def chat_model(
    out: Annotated[Path, typer.Option(help="The new model directory.")] = Path("models/word-problems"),
    train: Annotated[
        Path, typer.Option(help="JSONL of {question, answer} to train the tokenizer and warm start on.")
    ] = DATA / "train.jsonl",
    test: Annotated[Path, typer.Option(help="Held-out JSONL the warm start is measured on.")] = DATA / "test.jsonl",
    steps: Annotated[int, typer.Option(min=1, help="Warm-start steps.")] = 1100,
    seed: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """Build a small Qwen2 chat model with its own BPE tokenizer, warm-started on worked
    answers (for experiments/word_problems.yaml)."""
    from rich import print as rprint

    try:
        manifest = build_chat_model(out, train, test, steps=steps, seed=seed)
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    evaluated = manifest["eval"]
    rprint(
        f"{out}: {manifest['parameters']:,} parameters, vocabulary {manifest['vocab_size']}, held-out greedy "
        f"accuracy {evaluated['greedy_accuracy']:.3f} on {evaluated['problems']} problems"
    )
