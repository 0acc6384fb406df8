"""Rollout: engines that sample completions with behaviour log-probs, and the worker."""

from asyncrlhf.rollout.base import InFlight, RolloutEngine, Sample, Sampling
from asyncrlhf.rollout.hf import HFEngine
from asyncrlhf.rollout.stub import LatencyModelEngine, StubEngine
from asyncrlhf.rollout.vllm import VLLMEngine
from asyncrlhf.rollout.worker import RolloutWorker

__all__ = [
    "HFEngine",
    "InFlight",
    "LatencyModelEngine",
    "RolloutEngine",
    "RolloutWorker",
    "Sample",
    "Sampling",
    "StubEngine",
    "VLLMEngine",
]
