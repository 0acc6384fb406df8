"""Training: the policy-gradient trainer."""

from asyncrlhf.training.trainer import TrainerWorker, sequence_logprobs

__all__ = ["TrainerWorker", "sequence_logprobs"]
