"""Interleaved 1F1B, ZB-H1 and ZB-V on torch.distributed.pipelining: the translation keyed by
pipeline position (several stages a rank, I and W actions) that torch lowers, and real runs
on gloo whose trained parameters equal one-process training (slow: worker processes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from pipeplan.cluster import hierarchical
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.check import compare_states, reference_state
from pipeplan.runtime.executor import RunConfig, RunResult, run_plan
from pipeplan.runtime.pipelined import pipelined_ranks
from pipeplan.runtime.translate import pipeline_orders
from pipeplan.schedule import Kind, make_schedule

from test_runtime import model_graph

LAYOUTS = {"interleaved-1f1b": lambda j, p, s_count: j % p, "zb-v": lambda j, p, s_count: min(j, s_count - 1 - j),
           "zb-h1": lambda j, p, s_count: j}


class _FakeStage:
    """Just what torch's runtime reads to lower action lists (rank 0 of p)."""

    def __init__(self, n_stages: int, p: int) -> None:
        self.num_stages, self.group_size, self.group_rank = n_stages, p, 0
        self.stage_index, self.is_first, self.is_last = 0, True, n_stages == 1
        self.submod = torch.nn.Identity()


@pytest.mark.parametrize("name,p,chunks,m", [("interleaved-1f1b", 2, 2, 4), ("interleaved-1f1b", 4, 3, 8),
                                             ("interleaved-1f1b", 3, 2, 5), ("zb-v", 2, 2, 4), ("zb-v", 4, 2, 8),
                                             ("zb-h1", 4, 1, 8), ("zb-h1", 3, 1, 2)])
def test_translation_keys_positions_and_torch_lowers_it(name, p, chunks, m):
    s_count = p * chunks
    devs = [[LAYOUTS[name](j, p, s_count)] for j in range(s_count)]
    sched = make_schedule(name, devs, m)
    order = pipeline_orders(sched, devs, "split")[0]
    assert sorted(order) == list(range(p))
    for d in range(p):
        ir = dict(zip(sched.devices, sched.programs))[d]
        assert [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in order[d]] == [
            (s, Kind(k).name, mb) for k, s, mb in zip(ir.kinds.tolist(), ir.stages.tolist(), ir.micro.tolist())]
    rt = _PipelineScheduleRuntime([_FakeStage(s_count, p)], n_microbatches=m)
    rt._prepare_schedule_with_comms(order)  # torch validates and inserts the sends and receives
    assert rt.stage_index_to_group_rank == {j: devs[j][0] for j in range(s_count)}
    lowered = [a.computation_type.value for acts in rt.pipeline_order_with_comms.values() for a in acts]
    cross = sum(devs[j][0] != devs[j + 1][0] for j in range(s_count - 1))  # a chunk's next on another rank
    assert lowered.count("SEND_F") == lowered.count("RECV_F") == cross * m


def chunked_plan(name: str, k: int = 1, replicas: str = "split", spec: str = "example:mlp",
                 microbatch: int | None = None) -> tuple[Plan, int]:
    """Two device groups of k devices; 4 stages (2 for zb-h1) of about equal layers; the
    model's example input cut to ``microbatch`` samples when given."""
    g, names, z = model_graph(spec)
    if microbatch is not None:
        g.meta["microbatch"] = z = microbatch
    c = hierarchical("local", 1, 2 * k, 1e9, 1e9)
    s_count = 2 if name == "zb-h1" else 4
    cuts = [round(j * len(names) / s_count) for j in range(s_count + 1)]
    groups = [c.names[:k], c.names[k:]]
    stages = [Stage(names[cuts[j]:cuts[j + 1]], groups[LAYOUTS[name](j, 2, s_count)]) for j in range(s_count)]
    return Plan(g, c, stages, 4, schedule=name, replicas=replicas), z


def test_rank_layout_is_one_process_per_device():
    plan, _ = chunked_plan("interleaved-1f1b", k=2, replicas="round-robin")
    assert pipelined_ranks(plan) == [(0, "s0g0"), (1, "s0g2"), (0, "s0g1"), (1, "s0g3")]


def _ordered(out: RunResult, plan: Plan) -> None:
    """Every stage runs each microbatch's F, then B or I then W, on the measured timeline;
    an input gradient leaves stage s+1 before stage s uses it."""
    tl = out.timeline
    seen: dict[tuple[int, int, int], float] = {}
    for k, s, m, a, b in zip(tl.kind.tolist(), tl.stage.tolist(), tl.micro.tolist(), tl.start, tl.end):
        if k in (Kind.F, Kind.B, Kind.I, Kind.W):
            seen[(s, m, k)] = (a, b)
    for s in range(plan.num_stages):
        for m in range(plan.microbatches):
            back = seen.get((s, m, Kind.B)) or seen[(s, m, Kind.I)]
            assert back[0] >= seen[(s, m, Kind.F)][1] - 1e-6
            if (s, m, Kind.W) in seen:
                assert seen[(s, m, Kind.W)][0] >= back[1] - 1e-6
            if s + 1 < plan.num_stages and s > 0:
                nxt = seen.get((s + 1, m, Kind.B)) or seen[(s + 1, m, Kind.I)]
                assert back[1] >= nxt[0]


@pytest.mark.slow
@pytest.mark.parametrize("name,k,replicas,spec", [("zb-h1", 1, "split", "example:cnn"),
                                                  ("interleaved-1f1b", 2, "round-robin", "example:mlp"),
                                                  ("zb-v", 1, "split", "example:transformer")])
def test_runs_train_exactly_as_one_process(name, k, replicas, spec):
    plan, z = chunked_plan(name, k, replicas, spec, microbatch=4)  # small: the schedule is what is tested
    cfg = RunConfig(spec, steps=2, timeout_s=600)
    out = run_plan(plan, cfg)
    staged = out.params
    assert sorted(staged) == list(range(plan.num_stages)) and out.processes == 2 * k
    ref = reference_state(plan, spec, cfg.warmup + cfg.steps, cfg.lr, cfg.seed, cfg.threads, z)
    assert compare_states(staged, ref)[0] <= 1e-5
    _ordered(out, plan)
    kinds = set(np.unique(out.timeline.kind).tolist())
    assert ({Kind.I, Kind.W} <= kinds) == name.startswith("zb") and (Kind.B in kinds) != name.startswith("zb")
