"""Issue 44: the learning planners' answer is never worse than the trivial plans (data
parallelism, the equal-compute splits: ``learn.found``) nor, from a checkpoint on the
instance it was trained on, than the best plan its training found."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import one_server
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.learn.found import instance_key, record, recorded, trivial_candidates
from pipeplan.planners.base import PlanOptions, run_planner


def test_the_trivial_plans_are_dp_then_equal_compute_splits_by_hand():
    """8 nodes of equal work on 4 devices: one stage on all four; two stages of 4 nodes on 2
    devices each; four of 2 on one each (K divides the devices)."""
    g = Graph.chain("eq", [1.0] * 8, [2.0] * 8)
    parts, devs = trivial_candidates(g, 4)
    assert parts.tolist() == [[0] * 8, [0] * 4 + [1] * 4, [0, 0, 1, 1, 2, 2, 3, 3]]
    assert devs.tolist() == [[0] * 4, [0, 0, 1, 1], [0, 1, 2, 3]]


def test_an_uneven_chain_is_split_where_half_its_work_is_done():
    """Work 1, 1, 1, 5 (x3 with the backward): half of 24 is reached after the fourth node's
    first third, so the two stages are the first three nodes and the last."""
    g = Graph.chain("uneven", [1.0, 1.0, 1.0, 5.0], [2.0, 2.0, 2.0, 10.0])
    parts, _ = trivial_candidates(g, 2)
    assert parts.tolist() == [[0, 0, 0, 0], [0, 0, 0, 1]]


def test_a_checkpoints_best_is_used_on_its_own_instance_only():
    g, cl = Graph.chain("c", [1.0] * 4, [2.0] * 4), one_server(2)
    key = instance_key(g, cl, 4)
    rec = record(key, np.array([0, 0, 1, 1]), np.array([0, 1]), ("1f1b", "split"), 1.5)
    ex = (("1f1b", "split"), ("gpipe", "split"))
    part, dev, e = recorded({"best": rec}, key, 4, 2, ex, "ck.pt")
    assert part.tolist() == [0, 0, 1, 1] and dev.tolist() == [0, 1] and e == 0
    assert recorded({"best": rec}, instance_key(g, cl, 8), 4, 2, ex, "ck.pt") is None  # other microbatches
    assert recorded({"best": rec}, key, 4, 2, (("gpipe", "split"),), "ck.pt") is None  # an execution not allowed
    assert recorded({}, key, 4, 2, ex, "ck.pt") is None
    with pytest.raises(PipeplanError, match="not a plan of this instance"):
        recorded({"best": {**rec, "part": [0, 0, 9, 1]}}, key, 4, 2, ex, "ck.pt")


def _dp_optimal() -> tuple[Graph, object]:
    """4 layers whose activations are a terabyte: any cut sends it between stages (over 1 GB/s,
    1,000 s), so one stage on all four devices (data parallelism) wins; parameters are a
    byte, so its all-reduce costs nothing."""
    g = Graph.chain("dp-wins", [1.0] * 4, [2.0] * 4, params=[1.0] * 4, act=[1e12] * 4)
    return g, one_server(4)


@pytest.mark.parametrize("planner, options", [pytest.param("drl-pp", [("evaluations", "24")], marks=pytest.mark.slow),
                                             ("automap-infer", [])])
def test_both_agents_return_dps_plan_or_better_where_dp_is_optimal(planner, options):
    """The exhaustive search (``exact``) says no plan beats data parallelism here; both agents
    answer no worse than ``dp``."""
    from pipeplan.planners.base import planner_settings

    g, cl = _dp_optimal()
    base = PlanOptions(microbatches=4)
    dp = run_planner("dp", g, cl, base)[1].iteration_s
    exact = run_planner("exact", g, cl, base)[1].iteration_s
    assert exact == pytest.approx(dp, rel=1e-9)
    opts = PlanOptions(microbatches=4, settings=planner_settings([planner], options))
    plan, res = run_planner(planner, g, cl, opts)
    assert res.iteration_s <= dp * (1 + 1e-9) and len(plan.stages) == 1
    from pipeplan.cli.report import trivial_note  # the report says a trivial plan won, which

    assert trivial_note(plan).startswith(f"{planner} answers a trivial plan, data parallelism (")


@pytest.mark.slow  # trains an agent (seconds)
def test_drl_pp_weighs_data_parallelism_before_its_first_update():
    """24 layers on 8 devices, a terabyte between any two: every cut costs 1,000 s over 1 GB/s,
    more than data parallelism's whole iteration, so a plan of more than one stage is always
    slower. An untrained agent's walks rarely end in one partition; one update's worth of
    evaluations is enough to answer with data parallelism because it is weighed first."""
    from pipeplan.planners.base import planner_settings

    g = Graph.chain("dp-wins-24", [1.0] * 24, [2.0] * 24, params=[1.0] * 24, act=[1e12] * 24)
    cl = one_server(8)
    dp = run_planner("dp", g, cl, PlanOptions(microbatches=4))[1].iteration_s
    assert dp < 1000.0
    opts = PlanOptions(microbatches=4, settings=planner_settings(["drl-pp"], [("evaluations", "1"), ("samples", "0")]))
    plan, res = run_planner("drl-pp", g, cl, opts)
    assert len(plan.stages) == 1 and res.iteration_s <= dp * (1 + 1e-9)
    said = plan.extra["drl-pp"]  # the plan says the trivial plan won, and which
    assert said["trivial"] == said["found"] and said["found"].startswith("data parallelism (")


@pytest.mark.parametrize("planner", ["random", "anneal"])
def test_the_search_planners_spend_their_evaluations_and_weigh_the_trivial_plans(planner):
    """``random`` and ``anneal`` (DRL-PP's yardsticks, as planners): on the instance above they
    answer data parallelism; their search stops at the evaluations given (the trivial plans
    scored besides: one data-parallel and three split candidates under each of the 8
    synchronous executions)."""
    from pipeplan.planners.base import planner_settings

    g = Graph.chain("dp-wins-24", [1.0] * 24, [2.0] * 24, params=[1.0] * 24, act=[1e12] * 24)
    cl = one_server(8)
    dp = run_planner("dp", g, cl, PlanOptions(microbatches=4))[1].iteration_s
    opts = PlanOptions(microbatches=4, settings=planner_settings([planner], [("evaluations", "40"), ("seed", "1")]))
    plan, res = run_planner(planner, g, cl, opts)
    assert len(plan.stages) == 1 and res.iteration_s <= dp * (1 + 1e-9)
    assert plan.extra[planner]["evaluations"] == 40 + 4 * 8 and plan.extra[planner]["complete"] is False
