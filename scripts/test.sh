#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: the README's test command. Given no
# arguments it also runs the vLLM tests in their own venv (scripts/test-vllm.sh; set
# ASYNCRLHF_SKIP_VLLM=1 to leave them out), whose venv is built beside the main suite (its
# install is mostly download: 6 min of a 68-min CI run when it ran after the suite); with arguments
# it runs pytest on them alone. Each phase prints its time: CI's budget is 35 min.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "[test.sh] $1 at ${SECONDS}s"; }
bash scripts/setup.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
phase "set up"
setup_vllm=""
if [ -z "${ASYNCRLHF_SKIP_VLLM:-}" ]; then
    mkdir -p .venv-vllm
    # its own process group (setsid), so a failing main suite stops the whole install
    setsid --wait bash scripts/setup-vllm.sh > .venv-vllm/setup.log 2>&1 &
    setup_vllm=$!
    trap 'kill -- -"$setup_vllm" 2>/dev/null || true' EXIT
fi
.venv/bin/python -m pytest --durations=40  # the slowest tests
phase "main suite passed"
if [ -n "$setup_vllm" ]; then
    setup_rc=0
    wait "$setup_vllm" || setup_rc=$?
    trap - EXIT
    phase "vLLM venv set up (exit $setup_rc)"
    ASYNCRLHF_VLLM_SETUP_RC=$setup_rc bash scripts/test-vllm.sh
    phase "vLLM tests done"
fi
