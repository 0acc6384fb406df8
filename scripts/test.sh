#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: the README's test command. Given no
# arguments it then runs the vLLM tests in their own venv (scripts/test-vllm.sh; set
# ASYNCRLHF_SKIP_VLLM=1 to leave them out); with arguments it runs pytest on them alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest --durations=15  # the slowest tests: CI's time budget is 35 min
if [ -z "${ASYNCRLHF_SKIP_VLLM:-}" ]; then
    bash scripts/test-vllm.sh
fi
