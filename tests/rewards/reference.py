"""Plain-Python references the tensor-native rewards are checked against."""

from __future__ import annotations


def trim(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos)] if eos in row else row


def contains(row: list[int], pattern: list[int], eos: int) -> float:
    seq = trim(row, eos)
    p = len(pattern)
    if p == 0 or p > len(seq):
        return 0.0
    return float(any(seq[i : i + p] == pattern for i in range(len(seq) - p + 1)))


def exact(row: list[int], answer: list[int], eos: int) -> float:
    return float(eos in row and trim(row, eos) == answer)


def target_before_eos(row: list[int], target: int, eos: int) -> float:
    return float(target in trim(row, eos))
