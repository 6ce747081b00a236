"""The ``megatron`` baseline (planners/megatron.py): Megatron-LM's layout by hand, the
pipeline-depth sweep, recomputation only when needed."""

import pytest

from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.megatron import depths, megatron_plan
from pipeplan.sim import simulate


def test_depths_divide_the_devices_and_stay_within_the_layers():
    assert depths(12, 8) == [1, 2, 4, 8]
    assert depths(3, 8) == [1, 2]
    assert depths(5, 6) == [1, 2, 3]


def test_layout_is_data_parallel_rank_fastest():
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("1080ti-4x2")
    plan = megatron_plan(graph, cluster, PlanOptions(microbatches=8), 4, False)
    names = cluster.names
    assert [s.devices for s in plan.stages] == [names[0:2], names[2:4], names[4:6], names[6:8]]
    sizes = [len(s.nodes) for s in plan.stages]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(graph.ids)
    assert plan.replicas == "round-robin" and plan.schedule == "1f1b" and plan.recompute is None


def test_the_sweep_keeps_the_fastest_fitting_depth():
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("1080ti-4x2")
    options = PlanOptions(microbatches=8)
    chosen = run_planner("megatron", graph, cluster, options)[1].iteration_s
    times = []
    for p in depths(len(graph.ids), len(cluster)):
        for rec in (False, True):
            r = simulate(megatron_plan(graph, cluster, options, p, rec), timeline=False)
            if not r.over_memory:
                times.append(r.iteration_s)
    assert chosen == pytest.approx(min(times))
