"""Thread-safe replay buffers that know each experience's policy version."""

from asyncrlhf.buffers.base import ReplayBuffer, version_reader
from asyncrlhf.buffers.bounded import BoundedReplayBuffer, VersionedReplayBuffer
from asyncrlhf.buffers.group import GroupAwareReplayBuffer

__all__ = [
    "BoundedReplayBuffer",
    "GroupAwareReplayBuffer",
    "ReplayBuffer",
    "VersionedReplayBuffer",
    "version_reader",
]
