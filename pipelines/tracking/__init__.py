"""Tracking: the MLflow store (:mod:`.store`, checked by :mod:`.integrity`), a run's tracker
(:mod:`.tracker`), the evaluation table (:mod:`.evaltable`), plots (:mod:`.plots`) and the
export of a trained policy (:mod:`.export`)."""

from pipelines.tracking.tracker import *  # noqa: F403  (the tracker's public names)
from pipelines.tracking.tracker import __all__ as __all__
