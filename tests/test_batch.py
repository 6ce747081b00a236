"""The batched evaluator equals simulate() on every candidate (iteration, bounds, memory,
feasibility), over random graphs, clusters, schedules, replica modes and recomputation."""

from __future__ import annotations

import numpy as np
import pytest

from pipeplan.errors import Infeasible, PipeplanError
from pipeplan.sim import simulate
from pipeplan.sim.batch import BatchEvaluator

from randomplans import SCHEDULE_NAMES, random_candidates, random_cluster, random_graph

REL = 1e-9


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1e-300)


def _check_batch(rng: np.random.Generator) -> tuple[int, list[str]]:
    layers, v = int(rng.integers(3, 9)), int(rng.integers(2, 7))
    graph, cluster = random_graph(rng, layers), random_cluster(rng, v)
    stages = int(rng.integers(1, min(layers, v) + 1))
    ev = BatchEvaluator(graph, cluster, stages, int(rng.integers(1, 9)), str(rng.choice(SCHEDULE_NAMES)),
                        str(rng.choice(["split", "round-robin"])), str(rng.choice(["sgd", "adam"])))
    son, dst = random_candidates(rng, graph, cluster, stages, 25)
    rec = rng.random((25, stages)) < 0.3
    res = ev.evaluate(son, dst, rec)
    bad = []
    for b in range(25):
        try:
            plan = ev.plan(son[b], dst[b], rec[b])
            single = simulate(plan, timeline=False)
        except (Infeasible, PipeplanError):
            if res.feasible[b]:
                bad.append(f"candidate {b}: simulate refuses it, the batch does not")
            continue
        used = [cluster.index[n] for n in single.devices]
        pairs = [(res.iteration_s[b], single.iteration_s), (res.lower_s[b], single.lower_s),
                 (res.path_bound_s[b], single.path_bound_s), (res.work_bound_s[b], single.work_bound_s)]
        pairs += list(zip(res.memory_bytes[b, used], single.memory_bytes))
        if not res.feasible[b] or not all(_close(x, y) for x, y in pairs):
            bad.append(f"{ev.schedule}/{ev.replicas} candidate {b}: {[p for p in pairs if not _close(*p)]} feasible={res.feasible[b]}")
        if bool(res.over_memory[b]) != bool(single.over_memory):
            bad.append(f"candidate {b}: over-memory verdicts differ")
    return 25, bad


@pytest.mark.slow
def test_batched_equals_single_on_1000_candidates():
    rng = np.random.default_rng(2026)
    total, bad = 0, []
    while total < 1000:
        n, errs = _check_batch(rng)
        total, bad = total + n, bad + errs
    assert total >= 1000
    assert not bad, f"{len(bad)} of {total} candidates differ: {bad[:5]}"


def test_infeasible_candidates_are_flagged_not_raised():
    rng = np.random.default_rng(1)
    graph, cluster = random_graph(rng, 6), random_cluster(rng, 3)
    ev = BatchEvaluator(graph, cluster, 2, 4, "1f1b", "split")
    son = np.array([[0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])  # ok, backwards, empty stage
    dst = np.array([[0, 1, -1], [0, 1, -1], [0, 1, -1]])
    res = ev.evaluate(son, dst)
    assert res.feasible.tolist() == [True, False, False]
    assert np.isinf(res.iteration_s[1:]).all()
    with pytest.raises(PipeplanError):
        ev.evaluate(son[:, :3], dst)


def test_unknown_schedule_is_a_user_error():
    rng = np.random.default_rng(0)
    with pytest.raises(PipeplanError, match="unknown schedule"):
        BatchEvaluator(random_graph(rng, 3), random_cluster(rng, 2), 2, 4, "nope", "split")
