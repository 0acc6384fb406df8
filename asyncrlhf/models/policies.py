"""Start policies: the shipped checkpoint, cached warm starts, and loading any local model.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from asyncrlhf.models.tiny import VOCABULARY, TinyModelConfig, build_char_tokenizer, build_tiny_model
from asyncrlhf.models.warmstart import WarmStartConfig, warm_start

__all__ = [
    "SHIPPED_POLICY",
    "build_policy",
    "cache_dir",
    "load_pretrained",
    "load_tokenizer",
    "pretrained_policy",
    "shipped_policy",
]

SHIPPED_POLICY = Path(__file__).parents[1] / "checkpoints" / "tiny-addition"
"""The default start checkpoint: the warm start of ``TinyModelConfig()`` and ``WarmStartConfig()``."""
_MANIFEST = "asyncrlhf.json"  # beside the weights: configs, checksum, measured accuracy
_WEIGHTS = "model.safetensors"


def cache_dir() -> Path:
    """Where warm-started models are cached: ``$ASYNCRLHF_CACHE`` or ``~/.cache/asyncrlhf``."""
    return Path(os.environ.get("ASYNCRLHF_CACHE", Path.home() / ".cache" / "asyncrlhf"))


def _key(model_config: TinyModelConfig, warm: WarmStartConfig) -> str:
    import tokenizers
    import transformers

    spec = {
        "model": asdict(model_config),
        "warm_start": asdict(warm),
        "vocab": VOCABULARY,
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


def load_pretrained(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face directory (never the hub), the
    weights in ``dtype`` whatever the checkpoint's. A folder whose config names custom
    code is refused (never prompted for) unless ``trust_remote_code``, as in transformers."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"model path {directory} is not a Hugging Face model directory (no config.json)")
    hf_logging.disable_progress_bar()
    tokenizer = load_tokenizer(directory, trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=dtype, trust_remote_code=trust_remote_code
    )
    return model.to(device).eval(), tokenizer


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a local Hugging Face directory, with a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(path), local_files_only=True, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
