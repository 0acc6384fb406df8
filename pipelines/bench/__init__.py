"""Benchmarks: the cases and suites (:mod:`.suite` and a module per case), the regression
gate against the packaged ``baseline.json`` (:mod:`.gate`), and a benchmark run in MLflow
(:mod:`.log`)."""
