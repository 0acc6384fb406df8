"""The experiment platform (specs, CLI, MLflow tracking, sweeps, benchmarks).

Empty for now: it arrives with the pipelines issue. The core library ``asyncrlhf``
never imports from here.
"""
