#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
