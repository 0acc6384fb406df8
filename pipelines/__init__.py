"""The experiment platform: specs, the ``asyncrlhf`` CLI, MLflow tracking.

The core library ``asyncrlhf`` never imports from here; this layer may import mlflow.

Usage data is not sent from a user's experiments unless they ask: MLflow (≥ 3.2) and Ray
both collect it by default, so both are turned off here, before either is imported, for
this process and every one it starts (Ray's workers, trials, ``asyncrlhf ui``'s server).
A value the user set wins: ``MLFLOW_DISABLE_TELEMETRY=false`` and
``RAY_USAGE_STATS_ENABLED=1`` turn them back on.
"""

import os as _os

TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true", "RAY_USAGE_STATS_ENABLED": "0"}
for _name, _value in TELEMETRY_OFF.items():
    _os.environ.setdefault(_name, _value)
