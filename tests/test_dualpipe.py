"""DualPipeV (``dualpipe-v``): action by action torch's ``ScheduleDualPipeV`` (each
``OVERLAP_F_B`` read as its sub-actions, F then B), every backward once, its memory, its
closed form with equal unit times, and every shape simulated without deadlock."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.schedule import Kind, make_schedule
from pipeplan.sim import simulate

from helpers import one_server, uniform_chain


def v_devices(p: int, k: int = 1) -> list[list[int]]:
    """2p stages in a V on p groups of k devices: stage j on group min(j, 2p-1-j)."""
    return [list(range(min(j, 2 * p - 1 - j) * k, (min(j, 2 * p - 1 - j) + 1) * k)) for j in range(2 * p)]


def v_plan(p: int, m: int, graph: Graph, schedule: str = "dualpipe-v", k: int = 1, mode: str = "split") -> Plan:
    """The graph's layers in 2p equal stages, in a V over p groups of k devices."""
    per, c = len(graph) // (2 * p), one_server(p * k)
    stages = [Stage(graph.ids[j * per:(j + 1) * per], [c.names[d] for d in devs])
              for j, devs in enumerate(v_devices(p, k))]
    return Plan(graph, c, stages, m, schedule=schedule, replicas=mode)


def _dummy_stage(index: int, p: int, rank: int) -> SimpleNamespace:
    """What ``ScheduleDualPipeV.__init__`` reads of a stage: no process group, nothing run."""
    import torch

    return SimpleNamespace(submod=torch.nn.Identity(), group_size=p, group_rank=rank, num_stages=2 * p,
                           stage_index=index, is_first=index == 0, is_last=index == 2 * p - 1)


def torch_orders(p: int, m: int) -> dict[int, list[str]]:
    """torch's ``pipeline_order`` (every rank's, built by its constructor, which also lowers it
    with its sends and receives) with each ``OVERLAP_F_B`` read as its sub-actions. torch's
    stage indices are pipeplan's: both put stages r and 2p-1-r on rank r (its ``style="v"``)."""
    from torch.distributed.pipelining.schedules import OVERLAP_F_B, ScheduleDualPipeV

    sched = ScheduleDualPipeV([_dummy_stage(0, p, 0), _dummy_stage(2 * p - 1, p, 0)], m, loss_fn=lambda y, t: y)
    out = {}
    for rank, ops in sched.pipeline_order.items():
        assert all(a is not None for a in ops)
        out[rank] = [f"{s.computation_type.value}{s.microbatch_index}@{s.stage_index}" for a in ops
                     for s in (a.sub_actions if a.computation_type == OVERLAP_F_B else (a,))]
    return out


def ours(sched, device: int) -> list[str]:
    prog = dict(zip(sched.devices, sched.programs))[device]
    return [f"{Kind(k).name}{m}@{s}" for k, s, m in zip(prog.kinds.tolist(), prog.stages.tolist(),
                                                          prog.micro.tolist())]


CASES = [(p, m) for p in (1, 2, 4, 8) for m in (2 * p, 2 * p + 1, 2 * p + 3, 4 * p)] + [(3, 6), (3, 7), (5, 13)]


@pytest.mark.parametrize("p,m", CASES)
def test_order_is_torchs_dualpipe_v(p, m):
    sched = make_schedule("dualpipe-v", v_devices(p), m)  # check_schedule passed
    theirs = torch_orders(p, m)
    assert sorted(theirs) == list(range(p))
    for rank in range(p):
        assert ours(sched, rank) == theirs[rank]


def test_torch_refuses_fewer_microbatches_than_stages():
    """The rule ``dualpipe_v_order`` pads around."""
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_orders(4, 7)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 3), (4, 5), (8, 9)])
def test_fewer_microbatches_than_stages_leave_the_missing_ones_out(p, m):
    """M < 2p (torch refuses it): the order for 2p with microbatches M.. left out."""
    sched = make_schedule("dualpipe-v", v_devices(p), m)
    for rank, full in torch_orders(p, 2 * p).items():
        assert ours(sched, rank) == [a for a in full if int(a[1:a.index("@")]) < m]


def test_round_robin_replicas_run_torchs_order_on_their_share():
    p, m, k = 2, 12, 2
    sched = make_schedule("dualpipe-v", v_devices(p, k), m, "round-robin")
    for rank, theirs in torch_orders(p, m // k).items():
        for r in range(k):
            share = list(range(r, m, k))
            mine = ours(sched, rank * k + r)
            assert mine[-2:] == [f"AR-1@{rank}", f"AR-1@{2 * p - 1 - rank}"]  # the replicas' all-reduces
            assert mine[:-2] == [f"{a[0]}{share[int(a[1:a.index('@')])]}{a[a.index('@'):]}" for a in theirs]


@pytest.mark.parametrize("p,m", CASES)
def test_each_stage_runs_f_once_and_b_or_i_then_w_once(p, m):
    sched = make_schedule("dualpipe-v", v_devices(p), m)
    for prog in sched.programs:
        for s in np.unique(prog.stages).tolist():
            acts = [(k, mb) for k, st_, mb in zip(prog.kinds.tolist(), prog.stages.tolist(), prog.micro.tolist())
                    if st_ == s]
            for mb in range(m):
                kinds = [k for k, x in acts if x == mb]
                assert kinds in ([Kind.F, Kind.B], [Kind.F, Kind.I, Kind.W])
    assert sched.splits_backward and any(np.any(prog.kinds == Kind.B) for prog in sched.programs)


def _kept(layers: int) -> Graph:
    """Each layer keeps 1 byte for its backward and sends nothing."""
    return Graph.chain("kept", [1.0] * layers, [2.0] * layers, saved=[1.0] * layers)


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (2, 9), (4, 8), (4, 16), (8, 32)])
def test_every_device_keeps_2p_plus_1_chunk_microbatches(p, m):
    """The overlapped pair's F allocates before its B frees: 2p + 1 chunk-microbatches of one
    layer each (ZB-V keeps 2p)."""
    r = simulate(v_plan(p, m, _kept(2 * p)))
    assert list(r.memory_bytes) == pytest.approx([2 * p + 1] * p)
    assert max(simulate(v_plan(p, m, _kept(2 * p), "zb-v")).memory_bytes) == pytest.approx(2 * p)


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 32), (8, 16)])
def test_with_equal_unit_times_it_takes_zb_vs_time(p, m):
    """T_F = 1, B = 2 (I = W = 1) per chunk, no communication, M >= 2p: 6M + p - 1, as ZB-V."""
    g = uniform_chain(2 * p, 1.0, 2.0)
    assert simulate(v_plan(p, m, g)).iteration_s == pytest.approx(6 * m + p - 1)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 24), k=st.integers(1, 2), mode=st.sampled_from(["split", "round-robin"]),
       act=st.sampled_from([0.0, 1e8]))
def test_every_shape_runs(p, m, k, mode, act):
    r = simulate(v_plan(p, m, uniform_chain(2 * p, 1.0, 2.0, act=act), k=k, mode=mode), timeline=False)
    assert r.iteration_s >= r.lower_s - 1e-9


def torch_overlapped(p: int, m: int) -> dict[int, list[bool]]:
    """Per rank, each of torch's actions read as in ``torch_orders``: whether it is a
    sub-action of an ``OVERLAP_F_B``."""
    from torch.distributed.pipelining.schedules import OVERLAP_F_B, ScheduleDualPipeV

    sched = ScheduleDualPipeV([_dummy_stage(0, p, 0), _dummy_stage(2 * p - 1, p, 0)], m, loss_fn=lambda y, t: y)
    return {rank: [flag for a in ops for flag in ([True] * len(a.sub_actions) if a.computation_type == OVERLAP_F_B
                                                   else [False])]
            for rank, ops in sched.pipeline_order.items()}


@pytest.mark.parametrize("p,m", CASES)
def test_the_pairs_are_torchs_overlap_f_b_actions(p, m):
    """``Program.partners`` marks exactly the actions torch runs inside an ``OVERLAP_F_B``,
    each with the other's stage."""
    sched = make_schedule("dualpipe-v", v_devices(p), m)
    assert sched.overlap_pairs
    for rank, flags in torch_overlapped(p, m).items():
        prog = dict(zip(sched.devices, sched.programs))[rank]
        partner = prog.partners()
        assert (partner >= 0).tolist() == flags
        i = np.flatnonzero(partner >= 0)
        assert (partner[i] != prog.stages[i]).all() and set(partner[i].tolist()) <= set(prog.stages.tolist())


def _with_exchanges(p: int, fwd_comm: float, bwd_comm: float) -> Graph:
    """2p layers of F 1 s and B 2 s, each with ``fwd_comm``, ``bwd_comm`` of all-to-alls in them."""
    from dataclasses import replace

    from pipeplan.sim.stage_costs import PAIR_COMM

    g = uniform_chain(2 * p, 1.0, 2.0)
    return replace(g, meta={**g.meta, PAIR_COMM: {n: [fwd_comm, bwd_comm] for n in g.ids}})


@pytest.mark.parametrize("comm, pair_s", [
    ((0.6, 0.6), 1.8 + 20 / 132 * 1.2),  # compute 3 - 1.2 outlasts the exchanges: it runs on 112 of 132 SMs
    ((0.9, 1.9), 2.8),  # the exchanges 0.9 + 1.9 outlast the compute 0.2: they set the pair
])
def test_an_overlapped_pair_takes_deepseeks_overlap(comm, pair_s):
    """DeepSeek-V3 §3.2.1-2: a forward (1 s) and a backward (2 s) of the other chunk overlapped,
    one's all-to-alls behind the other's compute, the exchanges holding 20 of the H800's 132
    SMs while they run: the pair lasts max(exchanges, compute + 20/132 x exchanges). Unpaired
    passes last what they did."""
    p, m = 2, 8
    r = simulate(v_plan(p, m, _with_exchanges(p, *comm)))
    tl, sched = r.timeline, make_schedule("dualpipe-v", v_devices(p), m)
    for dev in range(p):
        partner = dict(zip(sched.devices, sched.programs))[dev].partners()
        mine = [t for t in np.flatnonzero(tl.resource == dev)[np.argsort(tl.start[tl.resource == dev], kind="stable")]
                if int(tl.kind[t]) in (int(Kind.F), int(Kind.B), int(Kind.I), int(Kind.W))]
        took = (tl.end - tl.start)[mine]
        assert len(mine) == partner.size and (partner >= 0).sum() >= 2
        for i in np.flatnonzero(partner >= 0)[::2]:  # each pair: its F, then its B
            assert took[i] + took[i + 1] == pytest.approx(pair_s)
            assert took[i] / took[i + 1] == pytest.approx(1.0 / 2.0)
        alone = np.array([int(tl.kind[t]) for t in mine])[partner < 0]
        assert took[partner < 0][alone == int(Kind.F)] == pytest.approx(1.0)
    assert simulate(v_plan(p, m, _with_exchanges(p, *comm), "zb-v")).iteration_s > r.iteration_s
    assert r.iteration_s >= r.lower_s - 1e-9


def test_explain_credits_a_pairs_compute_whole_and_the_rest_to_the_all_to_alls():
    """Mixtral 8x7B on 16 H100s, EP 8 over both servers: DualPipeV and ZB-V compute the same
    (forward, backward and recomputation terms equal); DualPipeV's all-to-all term is what its
    pairs take beyond their compute, below ZB-V's."""
    from pipeplan.cluster import load_cluster
    from pipeplan.graph.llm import build_graph
    from pipeplan.llm.layout import v_candidates
    from pipeplan.llm.parallelism import Parallelism
    from pipeplan.llm.spec import PRESETS
    from pipeplan.planners import llm3d
    from pipeplan.sim.explain import explain

    graph, cluster = build_graph(PRESETS["mixtral-8x7b"], 1), load_cluster("dgx-h100x2")
    terms = {}
    for sched in ("zb-v", "dualpipe-v"):
        par = Parallelism(1, 2, 8, v_candidates(32, 2)[0], 2, ep=8, microbatch=1, recompute="full", zero=1,
                          schedule=sched)
        terms[sched] = explain(llm3d.plan_of(graph, cluster, par, 32))["terms"]
    for term in ("forward", "backward", "recompute"):
        assert terms["dualpipe-v"][term] == pytest.approx(terms["zb-v"][term], rel=1e-9)
    assert 0 < terms["dualpipe-v"]["ep_comm"] < terms["zb-v"]["ep_comm"]
