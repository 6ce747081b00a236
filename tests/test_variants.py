"""Memory variants (fit_memory) against brute force, graph scaling in closed form, and the
choice of microbatch size for a global batch against an explicit loop."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from helpers import one_server, uniform_chain
from randomplans import random_cluster, random_graph

from pipeplan.cluster import Cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.graph import zoo
from pipeplan.graph.scale import AFFINE, CONSTANT, LINEAR, STRUCTURE, with_microbatch
from pipeplan.planners import PlanOptions, get_planner
from pipeplan.planners.variants import batch_choices, fit_memory, plan_for_global_batch, recompute_payoffs
from pipeplan.plan import Plan, Stage
from pipeplan.schedule import Kind, make_schedule
from pipeplan.sim import simulate


# -- fit_memory against brute force ------------------------------------------------------------

def _random_plan(rng: np.random.Generator) -> Plan:
    layers = int(rng.integers(3, 8))
    s_count = int(rng.integers(2, min(layers, 4) + 1))
    v = s_count + int(rng.integers(0, 3))
    g, c = random_graph(rng, layers), random_cluster(rng, v)
    cuts = [0, *sorted(rng.choice(np.arange(1, layers), s_count - 1, replace=False).tolist()), layers]
    perm = rng.permutation(v).tolist()
    devs = [[perm[s]] for s in range(s_count)]
    for d in perm[s_count:]:
        devs[int(rng.integers(s_count))].append(d)
    stages = [Stage(g.ids[a:b], [c.names[d] for d in ds]) for a, b, ds in zip(cuts, cuts[1:], devs)]
    floor = [bool(x) for x in rng.random(s_count) < 0.2] if rng.random() < 0.3 else None
    return Plan(g, c, stages, int(rng.integers(1, 7)), schedule=str(rng.choice(["gpipe", "1f1b", "spp-pe"])),
                replicas=str(rng.choice(["split", "round-robin"])), recompute=floor)


def _peak_in_flight(name: str, plan: Plan) -> dict[int, int]:
    """Microbatches forwarded and not yet backwarded, at most, per device (walked action by action)."""
    sched = make_schedule(name, plan.stage_devices(), plan.microbatches, plan.replicas)
    out = {}
    for d, prog in zip(sched.devices, sched.programs):
        live: set[int] = set()
        peak = 0
        for k, m in zip(prog.kinds.tolist(), prog.micro.tolist()):
            if k == Kind.F:
                live.add(m)
            elif k in (Kind.B, Kind.W):
                live.discard(m)
            peak = max(peak, len(live))
        out[d] = peak
    return out


def _oracle_schedules(plan: Plan) -> list[str]:
    if plan.schedule == "1f1b":
        return ["1f1b"]
    mine, fewer = _peak_in_flight(plan.schedule, plan), _peak_in_flight("1f1b", plan)
    return [plan.schedule] + (["1f1b"] if any(mine[d] > fewer[d] for d in mine) else [])


def _brute_force(plan: Plan) -> dict:
    """Every schedule x every superset of the planner's re-materializing stages, simulated."""
    floor = [plan.recomputes(s) for s in range(plan.num_stages)]
    table = {}
    for sched in _oracle_schedules(plan):
        for sub in itertools.product([False, True], repeat=plan.num_stages):
            if any(f and not x for f, x in zip(floor, sub)):
                continue
            v = replace(plan, schedule=sched, recompute=list(sub) if any(sub) else None)
            table[sched, sub] = simulate(v, timeline=False)
    return table


def _with_limits(plan: Plan, table: dict, rng: np.random.Generator, case: str) -> Plan:
    """The plan on its cluster with memory limits between the least and the most any variant needs."""
    names = next(iter(table.values())).devices
    mem = np.array([r.memory_bytes for r in table.values()])
    lo, hi = mem.min(axis=0), mem.max(axis=0)
    limit = {"fits": hi * 1.05, "none": lo * 1.2, "mixed": rng.uniform(lo, hi),
             "wide": rng.uniform(0.9 * lo, 1.05 * hi)}[case]
    limit = np.where(hi > lo * (1 + 1e-6), limit, hi * 1.05)  # no limit within rounding of a need
    if case == "none":  # one device below the least it ever needs
        i = int(rng.integers(len(names)))
        limit[i] = 0.5 * lo[i]
    by_name = dict(zip(names, np.maximum(limit, 1.0)))
    c = plan.cluster
    devices = [replace(d, memory=float(by_name.get(d.name, d.memory))) for d in c.devices]
    return replace(plan, cluster=Cluster(c.name, devices, c.bandwidth, c.latency, meta=dict(c.meta)))


def _premises_hold(table: dict, plan: Plan) -> bool:
    """A stage's memory depends only on its own flag, and adding re-materialization never
    makes the iteration shorter (the conditions under which the greedy is optimal)."""
    for sched in {k[0] for k in table}:
        rows = {sub: r for (s, sub), r in table.items() if s == sched}
        for a, b in itertools.permutations(rows, 2):
            ra, rb = rows[a], rows[b]
            if all(x <= y for x, y in zip(a, b)) and rb.iteration_s < ra.iteration_s * (1 - 1e-12):
                return False
            sod = np.asarray(ra.stage_of_device)
            for s in range(plan.num_stages):
                if a[s] == b[s] and not np.allclose(ra.memory_bytes[sod == s], rb.memory_bytes[sod == s], rtol=1e-9):
                    return False
    return True


@pytest.mark.slow
def test_fit_memory_matches_brute_force():
    rng = np.random.default_rng(2024)
    seen = {"fits": 0, "none": 0, "variant": 0, "premises": 0}
    for trial in range(48):
        plan0 = _random_plan(rng)
        table = _brute_force(plan0)
        plan = _with_limits(plan0, table, rng, ("fits", "none", "mixed", "mixed", "mixed", "wide")[trial % 6])
        limit = plan.cluster.memory[[plan.cluster.index[n] for n in next(iter(table.values())).devices]]
        fitting = {k: r.iteration_s for k, r in table.items() if np.all(r.memory_bytes <= limit)}
        got = fit_memory(plan)
        premises = _premises_hold(table, plan0)
        if not simulate(plan, timeline=False).over_memory:
            assert got is plan
            seen["fits"] += 1
            continue
        if not fitting:
            assert got is plan and "memory_variant" not in got.extra
            seen["none"] += 1
            continue
        seen["variant"] += 1
        if got is plan and not premises:
            continue  # coupled memories (contention shifts replicas' shares): no guarantee
        res = simulate(got, timeline=False)
        assert not res.over_memory
        assert got.stages == plan.stages and got.microbatches == plan.microbatches
        assert all(got.recomputes(s) for s in range(plan.num_stages) if plan.recomputes(s))
        key = (got.schedule, tuple(got.recomputes(s) for s in range(plan.num_stages)))
        assert key in fitting
        mv = got.extra["memory_variant"]
        assert mv["schedule"] == got.schedule and mv["original_schedule"] == plan.schedule
        assert mv["recompute"] == [s for s in range(plan.num_stages) if got.recomputes(s)]
        assert mv["added_recompute"] == [s for s in mv["recompute"] if not plan.recomputes(s)]
        if premises:
            seen["premises"] += 1
            assert res.iteration_s == pytest.approx(min(fitting.values()), rel=1e-9), (trial, key, fitting)
    assert seen["fits"] >= 5 and seen["none"] >= 5 and seen["variant"] >= 12, seen
    assert seen["premises"] >= 0.7 * seen["variant"], seen


def test_fit_memory_closed_form_two_stages():
    """GPipe keeps all 4 microbatches; 1F1B keeps 2 on stage 0 and 1 on stage 1; a backward
    step adds its gradient pair (2e6 on both stages). With 1e6 bytes per layer output and no
    parameters (docs/memory.md): GPipe needs 8e6 + 2e6 and 12e6 + 2e6 bytes, GPipe
    re-materializing 0 + 2e6 + 2e6 and 4e6 + 2e6 + 2e6, 1F1B 4e6 + 2e6 and 3e6 + 2e6. Under
    a 6.5e6 limit only 1F1B fits, with no re-materialization."""
    g = uniform_chain(4, act=1e6)
    c = one_server(2).with_memory(6.5e6)
    plan = Plan(g, c, [Stage(g.ids[:2], [c.names[0]]), Stage(g.ids[2:], [c.names[1]])], 4, schedule="gpipe")
    r = simulate(plan, timeline=False)
    assert r.memory_bytes.tolist() == pytest.approx([10e6, 14e6])
    rec = simulate(replace(plan, recompute=[True, True]), timeline=False)
    assert rec.memory_bytes.tolist() == pytest.approx([4e6, 8e6])
    got = fit_memory(plan)
    assert got.schedule == "1f1b" and got.recompute is None
    assert simulate(got, timeline=False).memory_bytes.tolist() == pytest.approx([6e6, 5e6])
    assert got.extra["memory_variant"] == {"schedule": "1f1b", "recompute": [], "added_recompute": [],
                                           "original_schedule": "gpipe"}
    assert plan.extra == {} and plan.schedule == "gpipe"  # the planner's plan is left as it was


def test_fit_memory_recomputes_only_the_overflowing_stage():
    """1F1B: stage 0 keeps 2 microbatches of 2e6 + 0, stage 1 one of 2e6 + 1e6, each + 2e6 of
    gradients during a backward. A 5.5e6 limit is passed by stage 0 only; re-materializing
    it: 0 x 2 + 2e6 + 2e6 during a backward."""
    g = uniform_chain(4, act=1e6)
    c = one_server(2).with_memory(5.5e6)
    plan = Plan(g, c, [Stage(g.ids[:2], [c.names[0]]), Stage(g.ids[2:], [c.names[1]])], 4, schedule="1f1b")
    got = fit_memory(plan)
    assert got.recompute == [True, False] and got.schedule == "1f1b"
    assert simulate(got, timeline=False).memory_bytes.tolist() == pytest.approx([4e6, 5e6])
    assert simulate(got, timeline=False).iteration_s > simulate(plan, timeline=False).iteration_s


def test_recompute_payoffs_closed_form():
    """1F1B, M = 4, two stages of two layers (forward 1 s each, outputs 1e6 bytes, gradient
    pairs 2e6): stage 0 peaks at 2 x 2e6 + 2e6 bytes, 2e6 + 2e6 when re-materializing, for
    4 x 2 s more compute: 2.5e5 B/s; stage 1 at 1 x (2e6 + 1e6) + 2e6 either way (1e6
    received + 2e6 again + 2e6): 0 B/s."""
    g = uniform_chain(4, act=1e6)
    c = one_server(2)
    plan = Plan(g, c, [Stage(g.ids[:2], [c.names[0]]), Stage(g.ids[2:], [c.names[1]])], 4, schedule="1f1b")
    got = recompute_payoffs(plan, simulate(plan, timeline=False), [0, 1])
    assert got == {0: pytest.approx(2.5e5), 1: pytest.approx(0.0, abs=1e-9)}
    tight = replace(plan, cluster=c.with_memory(4.5e6))  # stage 1 needs 5e6 either way
    assert recompute_payoffs(tight, simulate(tight, timeline=False), [0, 1]) is None


# -- with_microbatch ---------------------------------------------------------------------------

def _profiled(b0: int = 4) -> Graph:
    g = Graph.chain("m", [1e-3, 2e-3, 4e-3], [2e-3, 3e-3, 8e-3], params=[10.0, 20.0, 30.0],
                    act=[100.0, 200.0, 300.0], flops=[1e6, 2e6, 3e6],
                    meta={"microbatch": b0, "fixed_s": {"l0": [4e-4, 5e-4], "l2": [1e-3, 0.0]},
                          "total_s": 0.03, "spread": {"l0": [0.0, 1.0]}, "update_s_per_byte": 1e-11})
    return g


def test_with_microbatch_closed_form():
    g = _profiled(4)
    h = with_microbatch(g, 12)  # r = 3
    fixed_f, fixed_b = np.array([4e-4, 0.0, 1e-3]), np.array([5e-4, 0.0, 0.0])
    assert h.fwd == pytest.approx(fixed_f + 3 * (g.fwd - fixed_f), rel=1e-12)
    assert h.bwd == pytest.approx(fixed_b + 3 * (g.bwd - fixed_b), rel=1e-12)
    assert h.fwd[1] == pytest.approx(6e-3) and h.bwd[2] == pytest.approx(24e-3)
    assert h.act.tolist() == pytest.approx([300.0, 600.0, 900.0])
    assert h.flops.tolist() == pytest.approx([3e6, 6e6, 9e6])
    assert h.params.tolist() == [10.0, 20.0, 30.0]
    assert h.ids == g.ids and h.edges == g.edges
    assert h.meta["microbatch"] == 12 and h.meta["profiled_microbatch"] == 4
    assert h.meta["fixed_s"] == g.meta["fixed_s"] and h.meta["update_s_per_byte"] == 1e-11
    assert "total_s" not in h.meta and "spread" not in h.meta
    assert g.meta["microbatch"] == 4 and g.fwd[1] == 2e-3  # the input is not changed


def test_with_microbatch_round_trip_and_identity():
    g = _profiled(3)
    back = with_microbatch(with_microbatch(g, 6), 3)
    for a in ("fwd", "bwd", "act", "flops", "params"):
        assert np.allclose(getattr(back, a), getattr(g, a), rtol=1e-12, atol=0)
    assert back.meta["microbatch"] == 3
    assert with_microbatch(g, 3) == g


def test_with_microbatch_half_is_what_a_split_replica_runs():
    """Half the samples cost fixed + (t - fixed) / 2: the simulator's time for one of two
    equal replicas splitting a microbatch (docs/design.md, fixed per-call time)."""
    g = replace(_profiled(4), params=np.zeros(3))  # no all-reduce, no optimizer step
    h = with_microbatch(g, 2)
    c = one_server(2)
    whole = Plan(h, c, [Stage(list(h.ids), [c.names[0]])], 1, schedule="1f1b")
    split = Plan(g, c, [Stage(list(g.ids), c.names[:2])], 1, schedule="1f1b")
    busy_whole = simulate(whole, timeline=False).busy_s[0]
    busy_split = simulate(split, timeline=False).busy_s[0]
    assert busy_whole == pytest.approx(busy_split, rel=1e-12)


@pytest.mark.parametrize("field,value,scales", [("saved", [5.0, 0.0, 7.0], True),
                                                ("inplace", [False, True, False], False)])
def test_with_microbatch_carries_per_node_fields(field, value, scales):
    if field not in {f.name for f in dataclasses.fields(Graph)}:
        pytest.skip(f"Graph has no per-node field {field!r} yet")
    g = replace(_profiled(2), **{field: np.array(value)})
    h = with_microbatch(g, 6)
    expect = np.array(value, dtype=float) * (3 if scales else 1)
    assert np.array_equal(np.asarray(getattr(h, field), dtype=float), expect)


def test_every_graph_field_has_a_scaling_rule():
    classified = set(AFFINE) | set(LINEAR) | set(CONSTANT) | set(STRUCTURE)
    missing = [f.name for f in dataclasses.fields(Graph) if f.init and f.name not in classified]
    assert not missing, f"graph/scale.py does not say how {missing} scale with the microbatch"


def test_with_microbatch_rebuilds_zoo_models():
    g = zoo.build("bert-large", {"layers": "2"})
    h = with_microbatch(g, 8)
    assert h == zoo.build("bert-large", {"layers": "2", "microbatch": "8"})
    linear = with_microbatch(g.scaled(time=1.0, name="bert-large-copy"), 8)  # not the zoo's: linear
    assert np.allclose(linear.bwd, g.bwd * 2) and not np.allclose(h.bwd, g.bwd * 2)
    assert with_microbatch(h, 4) == g


def test_with_microbatch_refuses():
    g = uniform_chain(3)
    with pytest.raises(PipeplanError, match="'uniform'.*microbatch") as e:
        with_microbatch(g, 4)
    assert "\n" not in str(e.value)
    with pytest.raises(PipeplanError, match="integer >= 1"):
        with_microbatch(_profiled(4), 0)
    bad = Graph.chain("bad", [1e-3], [1e-3], meta={"microbatch": 2, "fixed_s": {"l0": [2e-3, 0.0]}})
    with pytest.raises(PipeplanError, match="'l0'.*fixed fwd time"):
        with_microbatch(bad, 4)
    with pytest.raises(PipeplanError, match="positive integer"):
        with_microbatch(Graph.chain("b", [1e-3], [1e-3], meta={"microbatch": 2.5}), 4)


def test_with_microbatch_refuses_pipedream_profiles():
    from conftest import profile_path

    g = load_graph(str(profile_path("alexnet")))
    with pytest.raises(PipeplanError, match="'alexnet'.*do not say"):
        with_microbatch(g, 16)


# -- batch_choices -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 12, 36, 64, 360, 720720])
@pytest.mark.parametrize("devices", [1, 4, 16])
def test_batch_choices_cover_the_global_batch(n, devices):
    g = _profiled(8)
    got = batch_choices(n, g, devices)
    divisors = [m for m in range(1, n + 1) if n % m == 0]
    assert all(b * m == n and b >= 1 and m >= 1 for b, m in got)
    assert len(set(got)) == len(got) == min(len(divisors), 12)
    ms = [m for _, m in got]
    assert ms == sorted(ms)
    if len(divisors) <= 12:
        assert ms == divisors
        return
    assert ms[0] == 1 and ms[-1] == n
    for target in (devices, 4 * devices):
        nearest = min(divisors, key=lambda m: (abs(math.log(m / target)), m))
        assert nearest in ms
    if n % 8 == 0:
        assert n // 8 in ms  # the profiled size
    gaps = np.diff(np.log(ms))
    assert gaps.max() <= 2.5 * math.log(n) / 11  # spread over [1, N], no large hole


def test_batch_choices_refuse():
    with pytest.raises(PipeplanError, match="global batch"):
        batch_choices(0, _profiled(), 4)
    with pytest.raises(PipeplanError, match="microbatch"):
        batch_choices(8, uniform_chain(3), 4)


# -- plan_for_global_batch ---------------------------------------------------------------------

def _loop(planner: str, graph: Graph, cluster: Cluster, n: int) -> list[tuple[int, int, float, bool, float]]:
    """(samples, M, iteration, fits, largest memory / limit) of every divisor split."""
    out = []
    fn = get_planner(planner).fn
    for m in (m for m in range(1, n + 1) if n % m == 0):
        plan = fit_memory(fn(with_microbatch(graph, n // m), cluster, PlanOptions(microbatches=m)))
        r = simulate(plan, timeline=False)
        out.append((n // m, m, r.iteration_s, not r.over_memory, float(np.max(r.memory_bytes / r.memory_limit))))
    return out


def _graph_for_batches() -> Graph:
    rng = np.random.default_rng(7)
    g = random_graph(rng, 8)
    fixed = {nid: [0.3 * g.fwd[i], 0.2 * g.bwd[i]] for i, nid in enumerate(g.ids)}
    return replace(g, params=g.params / 40, meta={"microbatch": 4, "fixed_s": fixed})


@pytest.mark.parametrize("planner", ["gpipe", "dp", "spp"])
def test_plan_for_global_batch_picks_the_fastest_that_fits(planner):
    g, n = _graph_for_batches(), 24
    free = one_server(4, bandwidth=2e9)
    rows = _loop(planner, g, free, n)
    # a memory limit that some splits pass and some do not
    need = sorted(r[4] * free.memory[0] for r in rows)
    cluster = free.with_memory(need[len(need) // 2])
    rows = _loop(planner, g, cluster, n)
    assert any(r[3] for r in rows) and not all(r[3] for r in rows)
    best = min((r for r in rows if r[3]), key=lambda r: r[2])
    got = plan_for_global_batch(get_planner(planner).fn, g, cluster, PlanOptions(), n)
    info = got.extra["global_batch"]
    assert (info["samples_per_microbatch"], info["microbatches"]) == best[:2]
    assert got.microbatches == best[1] and got.graph.meta["microbatch"] == best[0]
    assert simulate(got, timeline=False).iteration_s == pytest.approx(best[2], rel=1e-12)
    assert [(t["samples_per_microbatch"], t["microbatches"]) for t in info["tried"]] == [r[:2] for r in rows]
    assert [t["fits"] for t in info["tried"]] == [r[3] for r in rows]


def test_plan_for_global_batch_least_over_when_nothing_fits():
    g, n = _graph_for_batches(), 12
    cluster = one_server(3).with_memory(1.0)
    rows = _loop("gpipe", g, cluster, n)
    assert not any(r[3] for r in rows)
    least = min(rows, key=lambda r: (r[4], r[2]))
    got = plan_for_global_batch(get_planner("gpipe").fn, g, cluster, PlanOptions(), n)
    assert (got.extra["global_batch"]["samples_per_microbatch"], got.microbatches) == least[:2]
    assert simulate(got, timeline=False).over_memory


def test_plan_for_global_batch_keeps_planners_plans_when_asked():
    """Data parallelism under GPipe's schedule keeps all N samples' activations whatever the
    split; 1F1B keeps one microbatch. A limit that half the 1F1B splits pass: variants fit,
    the planner's own plans do not."""
    g, n, dp = _graph_for_batches(), 12, get_planner("dp").fn
    free, opts = one_server(2), PlanOptions(schedule="gpipe")
    needs = sorted(float(simulate(replace(dp(with_microbatch(g, n // m), free, replace(opts, microbatches=m)),
                                          schedule="1f1b"), timeline=False).memory_bytes.max())
                   for m in (1, 2, 3, 4, 6, 12))
    cluster = free.with_memory(needs[2] * 1.001)
    assert "memory_variant" in plan_for_global_batch(dp, g, cluster, opts, n).extra
    for kwargs, options in (({"memory_variants": False}, opts), ({}, replace(opts, allow_over_memory=True))):
        got = plan_for_global_batch(dp, g, cluster, options, n, **kwargs)
        assert "memory_variant" not in got.extra and got.schedule == "gpipe"


def test_plan_for_global_batch_refuses_unscalable_graphs():
    with pytest.raises(PipeplanError, match="microbatch"):
        plan_for_global_batch(get_planner("gpipe").fn, uniform_chain(3), one_server(2), PlanOptions(), 8)
