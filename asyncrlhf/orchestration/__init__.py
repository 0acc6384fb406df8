"""Coordination of rollout and training: versions and prompt flow."""

from asyncrlhf.orchestration.prompts import PromptQueue, PromptQueueClosed
from asyncrlhf.orchestration.version import VersionManager

__all__ = ["PromptQueue", "PromptQueueClosed", "VersionManager"]
