#!/usr/bin/env bash
# The checks that need a GPU, in one run: the CUDA tests (marked gpu; they skip without
# CUDA), then the figures of scripts/gpu_checks.py (the quick start's learning run on the
# GPU, HF generation throughput, the reward and loss benchmarks on CUDA tensors).
# Needs torch, transformers, peft, pytest and hypothesis; not Ray, MLflow or vLLM.
#   OUT=DIR bash scripts/gpu-checks.sh [gpu_checks.py options, e.g. --steps 400]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.gpu-checks}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
nvidia-smi -L || true
# Only the test folders whose modules import without Ray or MLflow; the rest skip on CPU too.
timeout "${TEST_TIMEOUT_S:-300}" "$py" -m pytest -m gpu -v -p no:cacheprovider -o addopts=-ra \
    --continue-on-collection-errors tests/rewards tests/losses tests/training tests/rollout/test_engines.py \
    tests/distributed/test_weight_channel_cuda.py 2>&1 | tee "$out/pytest.log"
timeout "${FIGURES_TIMEOUT_S:-420}" "$py" scripts/gpu_checks.py --out "$out" "$@" 2>&1 | tee "$out/figures.log"
