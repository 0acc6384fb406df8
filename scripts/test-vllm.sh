#!/usr/bin/env bash
# The vLLM tests, in ./.venv-vllm (made by scripts/setup-vllm.sh when missing): the engine
# against the Hugging Face pass, CLI runs (lagged, resumed, async), two vLLM actors on Ray.
# Where vLLM cannot be installed they are not run, and this says why (exit 0).
# ASYNCRLHF_VLLM_SET_UP=1: the venv was just made (scripts/test.sh makes it beside the main suite).
set -uo pipefail
cd "$(dirname "$0")/.."
log=.venv-vllm/setup.log
mkdir -p .venv-vllm
if [ -z "${ASYNCRLHF_VLLM_SET_UP:-}" ] && ! bash scripts/setup-vllm.sh > "$log" 2>&1; then
    echo "vLLM could not be installed here, so its tests did not run (see $log):"
    tail -n 5 "$log"
    exit 0
fi
exec .venv-vllm/bin/python -m pytest tests/rollout/test_vllm.py tests/pipelines/test_vllm_run.py "$@"
