"""The one order on simulated plans, used by every planner, ``compare``, ``best`` and joint's
search: a plan that fits comes before one that overflows; among plans that fit, the fastest;
among plans that overflow, the least over (the largest memory / limit over its devices), then
the fastest. With ``allow_over`` (what-if runs) every plan counts as fitting."""

from __future__ import annotations

import numpy as np

from ..sim import SimResult

#: a search's scalar score of an overflowing plan starts here (``rank_score``)
OVER = 1e9


def overflow_ratio(result: SimResult) -> float:
    """Largest memory / limit over the plan's devices (> 1: over memory)."""
    return float(np.max(result.memory_bytes / result.memory_limit))


def rank_key(result: SimResult, allow_over: bool = False) -> tuple[int, float, float]:
    """The plan's place in the order: smaller is better."""
    if allow_over or not result.over_memory:
        return 0, 0.0, result.iteration_s
    return 1, overflow_ratio(result), result.iteration_s


def rank_score(iteration_s: float, ratio: float, allow_over: bool = False) -> float:
    """``rank_key`` as one number, for searches that keep scores in arrays: the time of a plan
    that fits (ratio <= 1), else ``OVER`` + its overflow ratio (plans that overflow equally
    are tied, whatever their times)."""
    return iteration_s if allow_over or ratio <= 1.0 else OVER + ratio
