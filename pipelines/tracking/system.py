"""A run's system metrics (MLflow's CPU, memory, disk, network and GPU sampling into
``system/``, the UI's System metrics tab): every second for the first minute, so a short
run or a sweep trial has a curve, then every 10 seconds (MLflow's default)."""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

__all__ = ["SystemMetrics"]

FAST_S, SLOW_S, FAST_FOR_S = 1, 10, 60.0


class SystemMetrics:
    """Sample ``run_id``'s system metrics from :meth:`start` to :meth:`finish`."""

    def __init__(self, run_id: str, uri: str, resumed: bool) -> None:
        self.run_id, self.uri, self.resumed = run_id, uri, resumed
        self._monitor: Any = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(FAST_FOR_S, self._slow_down)
        self._timer.daemon = True
        self.interval_s: int | None = None  # the sampling interval now (None: not sampling)
        self._first_step = 0  # the monitor's logging step when it began

    def start(self) -> bool:
        """Begin sampling; False, with a warning, where MLflow's monitor cannot start."""
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop lines per run
        with self._lock:
            if not self._begin(FAST_S, resume=self.resumed):
                return False
        self._timer.start()
        return True

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._stop()

    def _slow_down(self) -> None:
        with self._lock:
            if self._monitor is not None:  # not finished meanwhile
                self._stop()
                self._begin(SLOW_S, resume=True)  # its steps go on from the fast ones

    def _begin(self, interval_s: int, resume: bool) -> bool:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(
                self.run_id, sampling_interval=interval_s, resume_logging=resume, tracking_uri=self.uri
            )
            monitor.start()
        except Exception as err:  # e.g. psutil missing
            warnings.warn(f"system metrics are not logged: {type(err).__name__}: {err}", stacklevel=3)
            return False
        self._monitor, self.interval_s = monitor, interval_s
        self._first_step = monitor._logging_step
        return True

    def _stop(self) -> None:
        monitor = self._monitor
        if monitor is not None:
            monitor.finish()
            if monitor._logging_step == self._first_step:  # ended within its first interval: one sample still
                try:
                    monitor.collect_metrics()
                    monitor.publish_metrics(monitor.aggregate_metrics())
                    monitor.mlflow_logger.flush()
                except Exception as err:  # the run's store gone: nothing to log into
                    warnings.warn(f"system metrics: the last sample is not logged: {err}", stacklevel=2)
        self._monitor, self.interval_s = None, None
