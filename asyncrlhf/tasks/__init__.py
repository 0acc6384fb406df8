"""Verifiable tasks: prompts whose answers are token ids, so rewards stay tensor-native."""

from asyncrlhf.tasks.addition import AdditionTask
from asyncrlhf.tasks.base import Problem, Task, encode_problem
from asyncrlhf.tasks.jsonl import JsonlTask

__all__ = ["AdditionTask", "JsonlTask", "Problem", "Task", "encode_problem"]
