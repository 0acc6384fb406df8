"""Training: the policy-gradient trainer."""

from asyncrlhf.training.trainer import OptimConfig, TrainerWorker, sequence_logprobs

__all__ = ["OptimConfig", "TrainerWorker", "sequence_logprobs"]
