"""Interleaved 1F1B, ZB-H1 and ZB-V: closed forms (equal unit times, no communication), the
orders torch's own schedules build, peak memory against 1F1B, validity and no deadlock over
many shapes, and one clear line for plans of the wrong shape."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.schedule import Kind, make_schedule
from pipeplan.sim import simulate

from helpers import chain_plan, one_server, uniform_chain


def chunked_plan(p: int, v: int, m: int, schedule: str, graph: Graph | None = None, shape: str = "loop",
                 replicas: int = 1, mode: str = "split") -> Plan:
    """v x p stages of equal layers; stage j on device group j mod p (loop) or min(j, 2p-1-j) (V)."""
    s_count = v * p
    g = graph or uniform_chain(s_count, 1.0, 2.0)
    per = len(g) // s_count
    c = one_server(p * replicas)
    pos = [j % p if shape == "loop" else min(j, 2 * p - 1 - j) for j in range(s_count)]
    stages = [Stage(g.ids[j * per:(j + 1) * per], c.names[pos[j] * replicas:(pos[j] + 1) * replicas])
              for j in range(s_count)]
    return Plan(g, c, stages, m, schedule=schedule, replicas=mode)


def pipeline(p: int, m: int, schedule: str, graph: Graph, replicas: int = 1, mode: str = "split") -> Plan:
    """p stages of equal layers, stage s on devices s k .. s k + k - 1."""
    per = len(graph) // p
    return chain_plan(graph, one_server(p * replicas), list(range(0, len(graph) + 1, per)), [replicas] * p, m,
                      schedule, mode)


# -- closed forms: T_F = T_I = T_W (a backward of 2 split in halves), no communication ----------

@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (2, 8), (3, 3), (4, 4), (4, 8), (4, 32), (8, 8), (8, 32)])
def test_zb_h1_takes_the_papers_bubble(p, m):
    """ZB-H1 (Qi et al. §3.1): M (T_F + T_B) + (p-1)(T_F + T_I - T_W); 1F1B: (M + p - 1)(T_F + T_B)."""
    tf, ti, tw = 1.0, 1.0, 1.0
    g = uniform_chain(p, tf, ti + tw)
    assert simulate(pipeline(p, m, "1f1b", g)).iteration_s == pytest.approx((m + p - 1) * (tf + ti + tw))
    assert simulate(pipeline(p, m, "zb-h1", g)).iteration_s == pytest.approx(
        m * (tf + ti + tw) + (p - 1) * (tf + ti - tw))


@pytest.mark.parametrize("p,m,cost", [(2, 8, 1.3), (4, 8, 1.5), (4, 32, 1.2)])
def test_a_measured_split_cost_is_charged_to_i_and_w(p, m, cost):
    """A profile that measured I + W = cost x B (``backward_split_cost``): each half takes
    cost x its share. With T_F = cost (so T_F = T_I = T_W again) ZB-H1 takes the paper's
    M (T_F + T_I + T_W) + (p-1)(T_F + T_I - T_W); in general it equals the same graph with
    every backward cost times longer and no split cost; 1F1B does not split and is unchanged."""
    g = uniform_chain(p, cost, 2.0)
    g.meta["backward_split_cost"] = cost
    assert simulate(pipeline(p, m, "zb-h1", g)).iteration_s == pytest.approx(3 * cost * m + (p - 1) * cost)
    g1, g2 = uniform_chain(p, 1.0, 2.0), uniform_chain(p, 1.0, 2.0 * cost)
    g1.meta["backward_split_cost"] = cost
    assert simulate(pipeline(p, m, "zb-h1", g1)).iteration_s == pytest.approx(
        simulate(pipeline(p, m, "zb-h1", g2)).iteration_s)
    assert simulate(pipeline(p, m, "1f1b", g1)).iteration_s == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 8), (2, 4, 6), (3, 2, 9), (4, 2, 8), (4, 3, 12),
                                   (4, 4, 32), (8, 2, 16)])
def test_interleaved_bubble_shrinks_by_the_chunks(p, v, m):
    """Interleaved 1F1B (SC'21 §2.2, Eq. 2 of the bubble): M (T_F + T_B) + (p-1)(T_F + T_B) / v,
    T_F and T_B a device's whole share (v chunks)."""
    layers = 2 * v * p
    g = uniform_chain(layers, 1.0, 2.0)
    t = layers / p * 3.0  # T_F + T_B of a device
    assert simulate(chunked_plan(p, v, m, "interleaved-1f1b", g)).iteration_s == pytest.approx(
        m * t + (p - 1) * t / v)
    assert simulate(pipeline(p, m, "1f1b", g)).iteration_s == pytest.approx((m + p - 1) * t)


@pytest.mark.parametrize("p,m", [(1, 4), (2, 3), (2, 8), (3, 5), (4, 7), (4, 32), (8, 16)])
def test_zb_v_leaves_only_the_start_of_the_last_device(p, m):
    """ZB-V with T_F = T_I = T_W = t per chunk and M >= 2p - 1: every device works 6 M t; the
    last device starts (p-1) t late (the forwards before it) and then never waits."""
    g = uniform_chain(2 * p, 1.0, 2.0)
    assert simulate(chunked_plan(p, 2, m, "zb-v", g, shape="v")).iteration_s == pytest.approx(6 * m + (p - 1))


# -- the same orders as torch's schedules ------------------------------------------------------

def _torch_order(cls, rank: int, **state) -> list[str]:
    ops = cls._calculate_single_rank_operations(SimpleNamespace(**state), rank)
    return [f"{a.computation_type.value}{a.microbatch_index}@{a.stage_index}" for a in ops if a is not None]


def _ours(sched, device: int) -> list[str]:
    p = dict(zip(sched.devices, sched.programs))[device]
    return [f"{Kind(k).name}{m}@{s}" for k, s, m in zip(p.kinds.tolist(), p.stages.tolist(), p.micro.tolist())]


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 9), (4, 2, 10), (4, 2, 3), (2, 3, 2)])
def test_interleaved_is_torchs_order(p, v, m):
    """Where torch's ScheduleInterleaved1F1B accepts M (groups of M / max(1, M // p))."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    sched = make_schedule("interleaved-1f1b", [[j % p] for j in range(v * p)], m)
    rounds = max(1, m // p)
    for rank in range(p):
        theirs = _torch_order(ScheduleInterleaved1F1B, rank, n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                              microbatches_per_round=m // rounds)
        assert _ours(sched, rank) == theirs


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 6)])
def test_zero_bubble_orders_are_torchs(p, m):
    """ZB-H1 is torch's interleaved zero-bubble schedule with one chunk (ZB1P); ZB-V its ZBV."""
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble

    h1 = make_schedule("zb-h1", [[s] for s in range(p)], m)
    v = make_schedule("zb-v", [[min(j, 2 * p - 1 - j)] for j in range(2 * p)], m)
    for rank in range(p):
        zb1p = _torch_order(ScheduleInterleavedZeroBubble, rank, n_local_stages=1, pp_group_size=p,
                            _n_microbatches=m, microbatches_per_round=m)
        assert _ours(h1, rank) == zb1p
        zbv = _torch_order(ScheduleZBVZeroBubble, rank, pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
        assert _ours(v, rank) == zbv


# -- memory -----------------------------------------------------------------------------------

def _kept(layers: int) -> Graph:
    """Every layer keeps 1 byte for its backward and sends nothing: each stage keeps the
    same bytes per microbatch in flight (the papers' M_B), no gradient workspace."""
    return Graph.chain("kept", [1.0] * layers, [2.0] * layers, saved=[1.0] * layers)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 4), (4, 16), (8, 32)])
def test_zb_h1_and_zb_v_keep_1f1bs_peak_memory(p, m):
    """ZB-H1 keeps at most p microbatches on every stage (1F1B's stage-0 peak, §3.1); ZB-V
    keeps 2p chunk-microbatches of half the size (§6)."""
    g = _kept(2 * p)
    peak = max(simulate(pipeline(p, m, "1f1b", g)).memory_bytes)
    assert peak == pytest.approx(min(p, m) * 2.0)
    assert max(simulate(pipeline(p, m, "zb-h1", g)).memory_bytes) == pytest.approx(peak)
    assert max(simulate(chunked_plan(p, 2, m, "zb-v", g, shape="v")).memory_bytes) <= peak + 1e-9


def test_interleaved_memory_is_megatrons_warmup():
    """Device 0 keeps warm-up + 1 chunk-microbatches: 2(p-1) + (v-1)p + 1 of 1/v each."""
    p, v, m = 4, 2, 8
    g = _kept(p * v)
    r = simulate(chunked_plan(p, v, m, "interleaved-1f1b", g))
    assert r.memory_bytes[0] == pytest.approx(2 * (p - 1) + (v - 1) * p + 1)
    assert r.devices == [f"s0g{d}" for d in range(p)] and r.stage_of_device == list(range(p))


# -- every shape runs ---------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 5), v=st.integers(2, 4), m=st.integers(1, 24), k=st.integers(1, 2),
       mode=st.sampled_from(["split", "round-robin"]))
def test_interleaved_runs_every_shape_and_never_loses_to_1f1b(p, v, m, k, mode):
    plan = chunked_plan(p, v, m, "interleaved-1f1b", replicas=k, mode=mode)
    r = simulate(plan, timeline=False)  # schedule.check passed, no deadlock
    assert r.iteration_s >= r.lower_s - 1e-9
    if k == 1:  # one pipeline, no all-reduce: interleaving only shortens the fill and drain
        assert r.iteration_s <= simulate(pipeline(p, m, "1f1b", plan.graph), timeline=False).iteration_s + 1e-9


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 24), k=st.integers(1, 2), mode=st.sampled_from(["split", "round-robin"]),
       act=st.sampled_from([0.0, 1e8]))
def test_zero_bubble_runs_every_shape(p, m, k, mode, act):
    g = uniform_chain(2 * p, 1.0, 2.0, act=act)
    for plan in (chunked_plan(p, 2, m, "zb-v", g, "v", k, mode), pipeline(p, m, "zb-h1", g, k, mode)):
        r = simulate(plan, timeline=False)
        assert r.iteration_s >= r.lower_s - 1e-9
        programs = make_schedule(plan.schedule, plan.stage_devices(), m, mode).programs
        assert not any(np.any(prog.kinds == Kind.B) for prog in programs)


# -- plans of the wrong shape: one line ----------------------------------------------------------

@pytest.mark.parametrize("build,fragment", [
    (lambda: pipeline(2, 4, "interleaved-1f1b", uniform_chain(4)), "needs several stages per device"),
    (lambda: pipeline(2, 4, "zb-v", uniform_chain(4)), "needs several stages per device"),
    (lambda: chunked_plan(2, 2, 4, "1f1b"), "runs one stage per device; this plan puts stages 0 and 2"),
    (lambda: chunked_plan(2, 2, 4, "zb-h1"), "runs one stage per device"),
    (lambda: chunked_plan(2, 2, 4, "zb-v"), "stage 2 is not on the devices of stage 1"),
    (lambda: chunked_plan(2, 2, 4, "interleaved-1f1b", shape="v"), "stage 2 is not on the devices of stage 0"),
    (lambda: chunked_plan(2, 3, 4, "zb-v"), "a V needs exactly two stages per group"),
])
def test_plans_of_the_wrong_shape_are_refused_in_one_line(build, fragment):
    with pytest.raises(PipeplanError, match=fragment) as e:
        simulate(build())
    assert "\n" not in str(e.value)


def test_interleaved_needs_a_multiple_of_the_groups_and_equal_round_robin_pipelines():
    g = uniform_chain(5)
    c = one_server(3)
    stages = [Stage([g.ids[j]], [c.names[j % 2]]) for j in range(5)]
    with pytest.raises(PipeplanError, match="5 stages on 2 device groups"):
        simulate(Plan(g, c, stages, 4, schedule="interleaved-1f1b"))
    g = uniform_chain(4)
    groups = [c.names[:2], c.names[2:]]
    uneven = Plan(g, c, [Stage([g.ids[j]], groups[j % 2]) for j in range(4)], 4, schedule="interleaved-1f1b",
                  replicas="round-robin")
    with pytest.raises(PipeplanError, match="same number of devices in every group"):
        simulate(uneven)
    uneven.replicas = "split"  # lockstep replicas: any sizes
    assert simulate(uneven).iteration_s > 0


def test_bounds_hold_for_chunked_plans_on_random_clusters():
    """Efficiency <= 1 over random graphs and clusters (latency, one-way links, several
    resources, contention, fixed times, the optimizer step) with loop and V layouts."""
    from randomplans import random_cluster, random_graph

    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(120):
        p, name = int(rng.integers(1, 4)), str(rng.choice(["interleaved-1f1b", "zb-v"]))
        v = 2 if name == "zb-v" else int(rng.integers(2, 4))
        k, mode = int(rng.integers(1, 3)), str(rng.choice(["split", "round-robin"]))
        graph, cluster = random_graph(rng, v * p), random_cluster(rng, p * k)
        pos = [j % p if name != "zb-v" else min(j, 2 * p - 1 - j) for j in range(v * p)]
        stages = [Stage([graph.ids[j]], cluster.names[pos[j] * k:(pos[j] + 1) * k]) for j in range(v * p)]
        try:
            r = simulate(Plan(graph, cluster, stages, int(rng.integers(1, 9)), schedule=name, replicas=mode),
                         timeline=False)
        except PipeplanError:  # no link between stages that talk, an edge back to an earlier stage
            continue
        checked += 1
        assert r.efficiency <= 1.0 + 1e-12
    assert checked > 60


def test_a_split_cost_below_one_is_noise_and_not_charged():
    g1, g2 = uniform_chain(2, 1.0, 2.0), uniform_chain(2, 1.0, 2.0)
    g1.meta["backward_split_cost"] = 0.6
    assert simulate(pipeline(2, 4, "zb-h1", g1)).iteration_s == pytest.approx(
        simulate(pipeline(2, 4, "zb-h1", g2)).iteration_s)
