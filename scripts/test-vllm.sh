#!/usr/bin/env bash
# The vLLM tests, in ./.venv-vllm (made by scripts/setup-vllm.sh when missing): the engine
# against the Hugging Face pass, CLI runs (lagged, resumed, async), two vLLM actors on Ray.
# Where vLLM cannot be installed they are not run, and this says why (exit 0).
# ASYNCRLHF_VLLM_SETUP_RC: the exit status of a setup already run (scripts/test.sh runs it
# beside the main suite, into the same log); unset, the setup runs here.
set -uo pipefail
cd "$(dirname "$0")/.."
log=.venv-vllm/setup.log
mkdir -p .venv-vllm
setup_rc=${ASYNCRLHF_VLLM_SETUP_RC:-}
if [ -z "$setup_rc" ]; then
    bash scripts/setup-vllm.sh > "$log" 2>&1
    setup_rc=$?
fi
if [ "$setup_rc" != 0 ]; then
    echo "vLLM could not be installed here, so its tests did not run (see $log):"
    tail -n 5 "$log"
    exit 0
fi
exec .venv-vllm/bin/python -m pytest tests/rollout/test_vllm.py tests/pipelines/test_vllm_run.py "$@"
