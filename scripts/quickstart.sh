#!/usr/bin/env bash
# Set up (idempotent) and run the quick-start experiment: the README's main command.
# Results go to ./mlflow (SQLite store + artifacts); `asyncrlhf ui` shows them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/asyncrlhf run experiments/quickstart.yaml "$@"
