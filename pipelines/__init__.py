"""The experiment platform: specs, the ``asyncrlhf`` CLI, MLflow tracking.

The core library ``asyncrlhf`` never imports from here; this layer may import mlflow.
"""
