"""Coordination of rollout and training: the runtime interface, versions, weights, the
in-process runtime (:class:`Orchestrator`)."""

from asyncrlhf.orchestration.evaluate import Evaluation, evaluate, evaluate_accuracy
from asyncrlhf.orchestration.history import RunHistory, TimelineEvent, bubble_fractions
from asyncrlhf.orchestration.orchestrator import Orchestrator
from asyncrlhf.orchestration.prompts import PromptQueue, PromptQueueClosed
from asyncrlhf.orchestration.record import StepRecorder
from asyncrlhf.orchestration.runtime import HeldOut, RunConfig, Runtime, RuntimeBase
from asyncrlhf.orchestration.schedule import MODES, Schedule, TrainerSide
from asyncrlhf.orchestration.version import VersionManager
from asyncrlhf.orchestration.weights import Snapshot, WeightStore, WeightStoreClosed

__all__ = [
    "MODES",
    "Evaluation",
    "HeldOut",
    "Orchestrator",
    "PromptQueue",
    "PromptQueueClosed",
    "RunConfig",
    "RunHistory",
    "Runtime",
    "RuntimeBase",
    "Schedule",
    "Snapshot",
    "StepRecorder",
    "TimelineEvent",
    "TrainerSide",
    "VersionManager",
    "WeightStore",
    "WeightStoreClosed",
    "bubble_fractions",
    "evaluate",
    "evaluate_accuracy",
]
