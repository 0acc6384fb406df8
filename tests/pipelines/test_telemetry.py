"""No usage data leaves a user's experiments unless they turn it on: MLflow's telemetry
and Ray's usage statistics are off in the platform's processes, and a user's own
setting wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pipelines  # noqa: F401  (what the platform sets on import)


def _environment(**given: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "RAY_USAGE_STATS_ENABLED")}
    env.pop("CI", None)  # MLflow turns itself off in CI: the platform must, without it
    env.pop("PYTEST_CURRENT_TEST", None)
    code = (
        "import json, os, pipelines.cli\n"
        "from mlflow.telemetry.utils import is_telemetry_disabled\n"
        "from ray._common.usage.usage_lib import usage_stats_enabled\n"
        "print(json.dumps([is_telemetry_disabled(), usage_stats_enabled()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**env, **given}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_telemetry_is_off_unless_the_user_turns_it_on():
    mlflow_off, ray_on = _environment()
    assert mlflow_off is True and ray_on is False
    mlflow_off, ray_on = _environment(MLFLOW_DISABLE_TELEMETRY="false", RAY_USAGE_STATS_ENABLED="1")
    assert ray_on is True  # the user's setting wins
    assert os.environ.get("MLFLOW_DISABLE_TELEMETRY") == "true"  # and so in this suite's processes
