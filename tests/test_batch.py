"""The batched evaluator against closed forms (the same cost code as simulate(), which
runs it with a batch of one, so these check the shared pieces independently), and equal to
simulate() on every candidate (iteration, bounds, memory, feasibility) over random graphs,
clusters, schedules, replica modes and recomputation (the batching itself: candidates
grouped by structure, layouts built from device_stage)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeplan.cluster import hierarchical
from pipeplan.errors import Infeasible, PipeplanError
from pipeplan.sim import simulate
from pipeplan.sim.batch import BatchEvaluator

from helpers import one_server, uniform_chain
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


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,m", [(1, 3), (2, 1), (3, 4), (4, 8), (8, 32)])
def test_uniform_pipeline_closed_form(schedule, stages, m):
    """S uniform stages, no transfers: (M + S - 1) x (f + b), for candidates that place the
    stages on the devices in any order; the path bound is one microbatch's S x (f + b)."""
    f, b = 0.3, 0.7
    g = uniform_chain(2 * stages, f / 2, b / 2)
    ev = BatchEvaluator(g, one_server(stages), stages, m, schedule)
    rng = np.random.default_rng(stages * 100 + m)
    son = np.repeat(np.arange(stages), 2)[None].repeat(4, axis=0)
    dst = np.stack([rng.permutation(stages) for _ in range(4)])
    res = ev.evaluate(son, dst)
    assert res.feasible.all()
    assert res.iteration_s == pytest.approx(np.full(4, (m + stages - 1) * (f + b)))
    assert res.path_bound_s == pytest.approx(np.full(4, stages * (f + b)))
    assert res.work_bound_s == pytest.approx(np.full(4, m * (f + b)))


@pytest.mark.parametrize("v,m", [(2, 4), (4, 9), (4, 3)])
def test_data_parallel_closed_form(v, m):
    """One stage on v devices taking microbatches in turn, then SPP Eq. 1's ring all-reduce."""
    f, b, params, bw = 0.2, 0.5, 1e6, 2e9
    g = uniform_chain(3, f, b, params=params)
    res = BatchEvaluator(g, one_server(v, bw), 1, m, "1f1b", "round-robin").evaluate(np.zeros(3), np.zeros(v))
    expected = math.ceil(m / v) * 3 * (f + b) + 2 * (v - 1) / v * 3 * params / bw
    assert res.iteration_s[0] == pytest.approx(expected)


def test_transfers_closed_form():
    """M = 1 through S stages and back: each cut crossed twice, act / bw + latency each."""
    s, f, b, act, bw, lat = 4, 0.1, 0.2, 3e6, 1e9, 1e-4
    g = uniform_chain(s, f, b, act=act)
    ev = BatchEvaluator(g, hierarchical("c", 1, s, bw, bw, latency=lat), s, 1, "gpipe")
    res = ev.evaluate(np.arange(s), np.arange(s))
    assert res.iteration_s[0] == pytest.approx(s * (f + b) + 2 * (s - 1) * (act / bw + lat))
    assert res.path_bound_s[0] == pytest.approx(res.iteration_s[0])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_memory_by_hand(schedule):
    """Stage s keeps min(S - s, M) microbatches in flight under 1F1B, all M under GPipe;
    each holds weights, gradients and Adam's two moments (4 x params), its own output plus
    what it received per microbatch, and one backward step's gradient pair."""
    s_count, m, act, params = 4, 8, 1000.0, 10.0
    g = uniform_chain(s_count, act=act, params=params)
    ev = BatchEvaluator(g, one_server(s_count), s_count, m, schedule)
    dst = np.array([[0, 1, 2, 3], [3, 2, 1, 0]])
    res = ev.evaluate(np.arange(s_count)[None].repeat(2, axis=0), dst)
    inflight = np.array([min(s_count - s, m) if schedule == "1f1b" else m for s in range(s_count)])
    stash = np.array([act] + [2 * act] * (s_count - 1))
    per_stage = 4 * params + inflight * stash + stash  # the gradient pair is as large as the stash here
    assert np.allclose(res.memory_bytes, per_stage[dst])


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
