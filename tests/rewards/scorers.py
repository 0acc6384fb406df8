"""Scorers for the decoded-reward tests: importable by path, so pool workers can run them."""

from __future__ import annotations

import time

from asyncrlhf.rewards.verify import math_score


def unruly(response: str, reference: str) -> float:
    """Hangs on 'hang', raises on 'boom', else the math verifier."""
    if "hang" in response:
        time.sleep(3600)
    if "boom" in response:
        raise RuntimeError("verifier exploded")
    return math_score(response, reference)


def flaky(response: str, reference: str) -> float:
    """Hangs on responses starting with '1', raises on those starting with '2'."""
    if response.startswith("1"):
        time.sleep(3600)
    if response.startswith("2"):
        raise ValueError("cannot read " + response)
    return math_score(response, reference)


def often_flaky(response: str, reference: str) -> float:
    """Hangs on responses starting with '1', raises on the others ending in an even digit."""
    if response.startswith("1"):
        time.sleep(3600)
    if response[-1:] in "02468" and response:
        raise ValueError("cannot read " + response)
    return math_score(response, reference)
