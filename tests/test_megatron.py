"""The ``megatron`` baseline (planners/megatron.py): Megatron-LM's layout by hand, the
pipeline-depth and model-chunk sweep (1F1B or interleaved 1F1B), recomputation only when needed."""

import pytest

from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.errors import PipeplanError
from pipeplan.graph import linearize
from pipeplan.planners.megatron import chunk_counts, depths, layer_mask, megatron_plan
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
    layers = [sum(n.startswith("layer") for n in s.nodes) for s in plan.stages]
    assert layers == [6, 6, 6, 6] and sum(len(s.nodes) for s in plan.stages) == len(graph.ids)
    assert plan.stages[0].nodes[0] == "embed" and plan.stages[-1].nodes[-2:] == ["pooler", "head"]
    assert plan.replicas == "round-robin" and plan.schedule == "1f1b" and plan.recompute is None


def test_the_sweep_keeps_the_fastest_fitting_depth_and_chunks():
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("1080ti-4x2")
    options = PlanOptions(microbatches=8)
    plan, result = run_planner("megatron", graph, cluster, options)
    times = {}
    for p in depths(len(graph.ids), len(cluster)):
        for v in chunk_counts(24, p, None):
            for rec in (False, True):
                r = simulate(megatron_plan(graph, cluster, options, p, rec, v), timeline=False)
                if not r.over_memory:
                    times[(p, v, rec)] = r.iteration_s
    assert result.iteration_s == pytest.approx(min(times.values()))
    one_f_one_b = min(t for (p, v, rec), t in times.items() if v == 1)
    assert result.iteration_s < one_f_one_b  # interleaving pays here: 8 microbatches on 4 stages
    assert plan.schedule == "interleaved-1f1b" and len({tuple(s.devices) for s in plan.stages}) < plan.num_stages


def test_chunks_per_schedule_divide_the_layers():
    assert chunk_counts(24, 4, None) == [1, 2, 3, 6]
    assert chunk_counts(24, 1, None) == [1]  # no interleaving without a pipeline
    assert chunk_counts(24, 4, "zb-h1") == [1]
    assert chunk_counts(24, 4, "interleaved-1f1b") == [2, 3, 6]
    assert chunk_counts(24, 4, "zb-v") == [2] and chunk_counts(24, 8, "zb-v") == []
    graph = load_graph("zoo:t5-base")
    lin = linearize(graph)
    assert int(layer_mask(graph, lin).sum()) == 24  # 12 + 12 blocks; embeddings and the LM head are extras


def test_interleaved_layout_is_chunk_j_on_position_j_mod_p():
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("1080ti-4x2")
    plan = megatron_plan(graph, cluster, PlanOptions(microbatches=8), 4, False, chunks=3)
    names = cluster.names
    assert plan.schedule == "interleaved-1f1b" and plan.num_stages == 12
    assert [s.devices for s in plan.stages] == [names[2 * (j % 4):2 * (j % 4) + 2] for j in range(12)]
    assert [sum(n.startswith("layer") for n in s.nodes) for s in plan.stages] == [2] * 12


@pytest.mark.parametrize("schedule", ["zb-v", "zb-h1"])
def test_an_explicit_schedule_gets_its_layout(schedule):
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("v100x4")
    plan, _ = run_planner("megatron", graph, cluster, PlanOptions(microbatches=8, schedule=schedule))
    assert plan.schedule == schedule
    groups = list(dict.fromkeys(tuple(s.devices) for s in plan.stages))
    p = len(groups)
    expected = [min(j, 2 * p - 1 - j) for j in range(2 * p)] if schedule == "zb-v" else list(range(p))
    assert [groups.index(tuple(s.devices)) for s in plan.stages] == expected


def test_interleaving_on_one_device_is_refused_in_one_line():
    graph, cluster = load_graph("zoo:bert-large"), load_cluster("hier:servers=1,gpus=1,intra=100Gbps,inter=10Gbps")
    with pytest.raises(PipeplanError, match="needs a pipeline of at least 2 devices whose number times the chunks"):
        run_planner("megatron", graph, cluster, PlanOptions(microbatches=8, schedule="interleaved-1f1b"))
