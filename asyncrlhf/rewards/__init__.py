"""Rewards computed as tensor operations on the tokens' own device."""

from asyncrlhf.rewards.contains import tensor_native_reward
from asyncrlhf.rewards.decoded import DecodedReward
from asyncrlhf.rewards.exact import exact_match_reward
from asyncrlhf.rewards.registry import (
    CompositeReward,
    RewardFn,
    RewardTerm,
    available_rewards,
    get_reward,
    register_reward,
    split_reward,
)
from asyncrlhf.rewards.simple import gpu_reward_simple
from asyncrlhf.rewards.text import make_text_reward, text_reward

__all__ = [
    "CompositeReward",
    "DecodedReward",
    "RewardFn",
    "RewardTerm",
    "available_rewards",
    "exact_match_reward",
    "get_reward",
    "gpu_reward_simple",
    "make_text_reward",
    "register_reward",
    "split_reward",
    "tensor_native_reward",
    "text_reward",
]
