"""asyncrlhf: asynchronous RL post-training for language models.

Core library: tensor-native rewards, policy losses for stale data (PPO, M2PO, GRPO),
version-aware replay buffers, and the orchestration that joins rollout and training.
Importing it needs only torch: ray, mlflow, optuna and vllm are imported where used.
"""

from asyncrlhf.types import Experience, ExperienceBatch, collate

__version__ = "0.1.0"

__all__ = ["Experience", "ExperienceBatch", "__version__", "collate"]
