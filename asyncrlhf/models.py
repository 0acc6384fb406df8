"""Policies: the tiny default model, its tokenizer and warm start, and loading.

No model hub is needed. The default policy is a small Llama-style ``transformers``
model built from a config, with a character tokenizer built by the ``tokenizers``
library (a real ``PreTrainedTokenizerFast``). A short supervised warm start on the
synthetic task brings it to a partly-correct policy so that RL has something to
improve.

The warm start is deterministic on one machine but not across CPUs: different float
kernels (AVX-512, AVX2, SSE) make 500 SFT steps land on models between 19% and 59%
greedy accuracy. So the default start checkpoint *ships with the package*
(:data:`SHIPPED_POLICY`, checksum-verified on every load) and every machine starts RL
from identical weights; rebuilding it is the explicit ``asyncrlhf warmstart`` command
(:func:`build_policy`). Other warm-start settings are built on first use and cached on
disk (``save_pretrained``) under a hash of everything that determines them. Any local
Hugging Face model directory loads the same way (:func:`load_pretrained`).

Shared numerics live here too: :func:`token_logprobs` is the one definition of
"log-prob of a token under temperature T" that both the rollout engine and the trainer
use, so on-policy ratios are exactly 1.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import string
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SHIPPED_POLICY",
    "TinyModelConfig",
    "WarmStartConfig",
    "build_char_tokenizer",
    "build_policy",
    "build_tiny_model",
    "cache_dir",
    "fit_answers",
    "gather_cache_rows",
    "load_pretrained",
    "load_tokenizer",
    "pretrained_policy",
    "shipped_policy",
    "token_logprobs",
    "warm_start",
    "weights_checksum",
]

SHIPPED_POLICY = Path(__file__).parent / "checkpoints" / "tiny-addition"
"""The default start checkpoint: the warm start of ``TinyModelConfig()`` and ``WarmStartConfig()``."""
_MANIFEST = "asyncrlhf.json"  # beside the weights: configs, checksum, measured accuracy
_WEIGHTS = "model.safetensors"

_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
_CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]


def cache_dir() -> Path:
    """Where warm-started models are cached: ``$ASYNCRLHF_CACHE`` or ``~/.cache/asyncrlhf``."""
    return Path(os.environ.get("ASYNCRLHF_CACHE", Path.home() / ".cache" / "asyncrlhf"))


def build_char_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast`` over printable ASCII.

    Ids: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then one id per character.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIALS + _CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the default Llama-style policy (≈ 0.34M parameters as given)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    max_position_embeddings: int = 64


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on the addition task (prompt → answer + EOS)."""

    digits: int = 2
    steps: int = 550
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0


def build_tiny_model(tokenizer: Any, config: TinyModelConfig = TinyModelConfig(), seed: int = 0) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` sized for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(llama)


def warm_start(model: Any, tokenizer: Any, config: WarmStartConfig = WarmStartConfig()) -> list[float]:
    """Teach ``model`` the answer format and some arithmetic; returns the loss curve.

    Cross-entropy on the answer tokens and the EOS only (the prompt is given).
    """
    from asyncrlhf.tasks.addition import AdditionTask

    task = AdditionTask(tokenizer, digits=config.digits, seed=config.seed)
    return fit_answers(model, task.train_problems(), tokenizer.eos_token_id, tokenizer.pad_token_id, config.steps,
                       config.batch_size, config.lr)  # fmt: skip


def fit_answers(
    model: Any, problems: Iterator[Any], eos: int, pad: int, steps: int, batch_size: int, lr: float
) -> list[float]:
    """Supervised fine-tuning on ``problems`` (prompt → answer + EOS): cross-entropy on the
    answer and the EOS only, AdamW with a cosine schedule; the loss curve."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    losses = []
    model.train()
    for _ in range(steps):
        batch = [next(problems) for _ in range(batch_size)]
        rows = [torch.cat([p.prompt_ids, p.answer_ids, torch.tensor([eos])]) for p in batch]
        ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)  # (B, T)
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for i, (p, row) in enumerate(zip(batch, rows, strict=True)):  # supervise answer + EOS only
            labels[i, p.prompt_ids.shape[0] : row.shape[0]] = row[p.prompt_ids.shape[0] :]
            attention[i, : row.shape[0]] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _key(model_config: TinyModelConfig, warm: WarmStartConfig) -> str:
    import tokenizers
    import transformers

    spec = {
        "model": asdict(model_config),
        "warm_start": asdict(warm),
        "vocab": _SPECIALS + _CHARS,
        "versions": [transformers.__version__, tokenizers.__version__, torch.__version__.split("+")[0]],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(directory: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((directory / _MANIFEST).read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise FileNotFoundError(f"{directory} has no readable {_MANIFEST}: {err}") from err


def shipped_policy(directory: Path = SHIPPED_POLICY) -> Path:
    """The shipped start checkpoint, its weights verified against the recorded SHA-256.

    Raises:
        FileNotFoundError: the checkpoint or its manifest is missing.
        ValueError: the weights do not match their checksum (a corrupted install).
    """
    manifest = _manifest(directory)
    expected, actual = manifest["sha256"], _sha256(directory / _WEIGHTS)
    if actual != expected:
        raise ValueError(
            f"{directory / _WEIGHTS}: SHA-256 {actual[:16]}… does not match the recorded {expected[:16]}…; "
            "reinstall asyncrlhf, or rebuild it with `asyncrlhf warmstart --out DIR`"
        )
    return directory


def _is_shipped(model_config: TinyModelConfig, warm: WarmStartConfig) -> bool:
    manifest = _manifest(SHIPPED_POLICY)
    return manifest["model"] == asdict(model_config) and manifest["warm_start"] == asdict(warm)


def build_policy(model_config: TinyModelConfig, warm: WarmStartConfig, out: Path) -> Path:
    """Build, warm-start and save a tiny policy into ``out`` (created atomically).

    ``out`` gets ``save_pretrained`` output of model and tokenizer and a manifest with
    both configs, the weights' SHA-256, the final loss and the build environment. The
    directory is staged beside ``out`` and renamed into place, so a reader never sees it
    half-written; if ``out`` appears meanwhile (a concurrent builder), the first one wins.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, model_config, seed=warm.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warm.seed)
        losses = warm_start(model, tokenizer, warm)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        manifest = {
            "model": asdict(model_config),
            "warm_start": asdict(warm),
            "sha256": _sha256(staging / _WEIGHTS),
            "final_loss": losses[-1] if losses else None,
            "built_with": _environment(),
        }
        (staging / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            staging.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _environment() -> dict[str, Any]:
    import platform

    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def pretrained_policy(
    model_config: TinyModelConfig = TinyModelConfig(),
    warm: WarmStartConfig = WarmStartConfig(),
    cache: Path | None = None,
) -> Path:
    """Directory of a warm-started tiny policy.

    The default configs give the shipped checkpoint (no training; checksum verified).
    Any other configs are built on first use and cached under a hash of the model
    config, the warm-start config, the vocabulary and the library versions; such a
    build is deterministic on one machine, not across CPUs.
    """
    if cache is None and _is_shipped(model_config, warm):
        return shipped_policy()
    root = cache or cache_dir()
    target = root / "models" / f"tiny-llama-{_key(model_config, warm)}"
    if (target / "config.json").is_file():
        return target
    return build_policy(model_config, warm, target)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face directory (never the hub)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"model path {directory} is not a Hugging Face model directory (no config.json)")
    hf_logging.disable_progress_bar()
    tokenizer = load_tokenizer(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    return model.to(device).eval(), tokenizer


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a local Hugging Face directory, with a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def cache_argument(model: Any) -> str:
    """The name of ``model.forward``'s KV-cache argument (and output): transformers 5
    renamed ``past_key_values`` to ``cache``. Looked up once per model class (the
    trainer asks on every pass)."""
    return _cache_argument_of(type(model))


@functools.cache
def _cache_argument_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def gather_cache_rows(cache: Any, index: torch.Tensor) -> bool:
    """Replace a KV cache's batch rows by ``cache[index]``, differentiably; False when
    the cache cannot gather (it is then unchanged).

    transformers' own ``batch_select_indices`` gathers with advanced indexing, whose
    backward (``index_put_`` with accumulate) adds into repeated rows with atomic float
    adds across threads on the CPU: the sum's order, and so the gradient's last bits,
    then depend on thread timing. A dynamic layer's keys and values are gathered here
    with ``index_select`` instead, whose backward adds in index order (bit-reproducible
    at any thread count); any other layer keeps its own method.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        if not hasattr(cache, "batch_select_indices"):
            return False
        cache.batch_select_indices(index)
        return True
    for layer in layers:
        if _plain_dynamic_layer(layer):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        else:
            layer.batch_select_indices(index)
    return True


def _plain_dynamic_layer(layer: Any) -> bool:
    """A layer whose whole batch state is its ``keys`` and ``values`` (transformers'
    ``DynamicLayer`` itself, not a subclass that selects more)."""
    from transformers.cache_utils import DynamicLayer

    return (
        type(layer).batch_select_indices is DynamicLayer.batch_select_indices
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and isinstance(getattr(layer, "values", None), torch.Tensor)
        and layer.keys.numel() > 0
    )


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log π(token) under ``softmax(logits / T)``, in float32.

    Args:
        logits: Tensor[..., V].
        tokens: LongTensor[...] matching ``logits`` without its last dimension.
        temperature: T > 0; 0 (greedy) is scored as T = 1.

    Returns:
        Tensor[...] of log-probs.
    """
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)  # (..., V)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def weights_checksum(weights: Any) -> str:
    """SHA-256 over every tensor of a model or state dict, in key order (device-agnostic)."""
    state: Mapping[str, torch.Tensor] = weights.state_dict() if hasattr(weights, "state_dict") else weights
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.view(torch.uint8).numpy() if tensor.numel() else b"")  # the buffer itself, no copy
    return digest.hexdigest()
