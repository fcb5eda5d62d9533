"""The task's verifiable reward, in plain Python: reward workers import only this, not
torch, so they start in a fraction of the time."""

from __future__ import annotations

DIGITS = 3
VOCAB = 10
MAX_TARGET = 9 * DIGITS
_SCORES = {0: 1.0, 1: 0.5, 2: 0.25}


def reward(target: int, digits: list[int]) -> float:
    """How close the digits' sum is to the target: 1 on it, 0.5 one off, 0.25 two off,
    else 0 (a random policy scores about 0.08)."""
    return _SCORES.get(abs(sum(digits) - target), 0.0)
