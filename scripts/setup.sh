#!/usr/bin/env bash
# Create ./.venv and install asyncrlhf with its dev tools.
# The CPU build of torch is installed first, pinned, so the loose `torch>=2.4` of
# pyproject.toml is already satisfied and pip never pulls a multi-GB CUDA build.
# On a GPU machine, install the torch build you want first and skip the pin:
#   TORCH_SPEC=skip bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if [ "${TORCH_SPEC:-torch==2.13.0}" != skip ]; then
    .venv/bin/python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
