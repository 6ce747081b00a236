"""The one order on plans (planners/ranking.py): fits, then fastest; else least over by
ratio, then fastest; its scalar form orders as the tuple does."""

import itertools

import numpy as np

from pipeplan.planners.ranking import OVER, overflow_ratio, rank_key, rank_score
from pipeplan.sim.simulate import SimResult


def result(iteration_s: float, memory: list[float], limit: list[float]) -> SimResult:
    n = len(memory)
    return SimResult(iteration_s, 0.0, 0.0, 0.0, [f"d{i}" for i in range(n)], [0] * n, np.zeros(n),
                     np.array(memory, dtype=float), np.array(limit, dtype=float), 0)


def test_fitting_plans_first_then_the_least_over_by_ratio_not_bytes():
    fast_over = result(1.0, [3.0, 1.0], [2.0, 2.0])
    slow_fit = result(9.0, [1.0, 1.0], [2.0, 2.0])
    # 0.5 GiB over a 1 GiB device (ratio 1.5) against 1 GiB over a 10 GiB one (1.1)
    few_bytes_over = result(1.0, [1.5, 0.0], [1.0, 10.0])
    many_bytes_over = result(2.0, [0.0, 11.0], [1.0, 10.0])
    ranked = sorted([fast_over, few_bytes_over, many_bytes_over, slow_fit], key=rank_key)
    assert ranked == [slow_fit, many_bytes_over, fast_over, few_bytes_over]
    assert overflow_ratio(many_bytes_over) == 1.1
    # what-if runs: every plan counts as fitting, the fastest first
    assert min([fast_over, slow_fit], key=lambda r: rank_key(r, allow_over=True)) is fast_over


def test_the_scalar_score_orders_as_the_key_does():
    rng = np.random.default_rng(0)
    results = [result(float(rng.uniform(0.1, 10)), list(rng.uniform(0, 2, 3)), [1.0, 1.0, 1.0]) for _ in range(60)]
    for a, b in itertools.combinations(results, 2):
        ka, kb = rank_key(a), rank_key(b)
        sa, sb = (rank_score(r.iteration_s, overflow_ratio(r)) for r in (a, b))
        if ka[:2] != kb[:2] or ka[0] == 0:  # overflowing plans equally over are tied in the score
            assert (ka < kb) == (sa < sb), (ka, kb, sa, sb)
    assert rank_score(5.0, 0.9) == 5.0 and rank_score(5.0, 1.2) == OVER + 1.2
