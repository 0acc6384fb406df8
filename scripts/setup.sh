#!/usr/bin/env bash
# Create ./.venv and install asyncrlhf with its dev tools.
# The CPU build of torch is installed first, pinned, so the loose `torch>=2.4` of
# pyproject.toml is already satisfied and pip never pulls a multi-GB CUDA build.
# On a GPU machine, install the torch build you want first and skip the pin:
#   TORCH_SPEC=skip bash scripts/setup.sh
# Elsewhere, choose the wheel, pip options included: TORCH_SPEC="torch --index-url URL"
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# pip byte-compiles what it installs (its default; keep it). Where PYTHONDONTWRITEBYTECODE
# is set (it is on the machines we build on) nothing is compiled at import, so every process
# (Ray workers, trainer ranks, CLI runs) would parse torch, transformers, ray and mlflow from
# source: with --no-compile each test ran 2.2-2.5x slower, to save 12 s of install.
pip=(.venv/bin/python -m pip install --quiet)
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ "$TORCH_SPEC" != skip ]; then
    # Unquoted on purpose: it may carry pip options, e.g. "torch --index-url URL".
    # shellcheck disable=SC2086
    "${pip[@]}" $TORCH_SPEC
fi
"${pip[@]}" -e ".[dev]"
