import json

import pytest

from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, NodeSpec
from pipeplan.plan import Plan, Stage, load_plan, plan_from_dict

from helpers import chain_plan, one_server, uniform_chain


def test_round_trip(tmp_path):
    g = uniform_chain(4, params=8.0, act=4.0)
    p = chain_plan(g, one_server(3), [0, 1, 4], [2, 1], 6, "1f1b")
    p.save(tmp_path / "p.json")
    q = load_plan(tmp_path / "p.json")
    assert q.graph == g and q.cluster == p.cluster and q.stages == p.stages
    assert (q.microbatches, q.schedule) == (6, "1f1b")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["format"] == "pipeplan.plan/1"
    assert d["stages"][0] == {"nodes": ["l0"], "devices": ["s0g0", "s0g1"]}


def test_more_stages_than_nodes_is_refused_before_they_are_built(tmp_path):
    """A tampered plan of millions of stages: one line from their count, not minutes."""
    g = uniform_chain(4, params=8.0, act=4.0)
    d = chain_plan(g, one_server(3), [0, 1, 4], [2, 1], 6, "1f1b").to_dict()
    d["stages"] = [{"nodes": ["l0"], "devices": ["s0g0"]}] * 5
    with pytest.raises(PipeplanError, match="5 stages for a graph of 4 nodes"):
        plan_from_dict(d)


def _plan(stages, m=2):
    g = uniform_chain(3)
    return Plan(g, one_server(3), [Stage(n, d) for n, d in stages], m)


@pytest.mark.parametrize("stages,fragment", [
    ([(["l0", "l1"], ["s0g0"]), (["l1", "l2"], ["s0g1"])], "is in stage 0 and stage 1"),
    ([(["l0"], ["s0g0"]), (["l1"], ["s0g1"])], "is in no stage"),
    ([(["l0", "l1"], ["s0g0"]), (["l2"], ["s0g0", "s0g1"])], "device 's0g0' is in stage 0 and stage 1, whose"),
    ([(["l0", "l1"], ["s0g0", "s0g1"]), (["l2"], ["s0g1", "s0g0"])], "device lists differ"),
    ([(["l0", "l1", "l2"], ["s0g0", "s0g0"])], "lists a device twice"),
    ([(["l0", "l2"], ["s0g0"]), (["l1"], ["s0g1"])], "back to stage"),
    ([(["l0", "l1", "l2"], ["gpu9"])], "device 'gpu9' is not in cluster"),
    ([(["l0", "l1", "lx"], ["s0g0"])], "node 'lx' is not in model"),
    ([(["l0", "l1", "l2"], [])], "has no devices"),
])
def test_validation(stages, fragment):
    with pytest.raises(PipeplanError, match=fragment):
        _plan(stages)


def test_microbatches_must_be_positive():
    with pytest.raises(PipeplanError, match="microbatches"):
        _plan([(["l0", "l1", "l2"], ["s0g0"])], m=0)


def test_bad_plan_files(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("[1, 2")
    with pytest.raises(PipeplanError, match="not valid JSON"):
        load_plan(f)
    f.write_text('{"format": "something-else"}')
    with pytest.raises(PipeplanError, match="not a pipeplan plan"):
        load_plan(f)
    with pytest.raises(PipeplanError, match="not found"):
        load_plan(tmp_path / "missing.json")


def test_dag_stage_order():
    nodes = [NodeSpec(x, 1.0, 1.0, 0.0, 1.0) for x in "abcd"]
    g = Graph.from_nodes("diamond", nodes, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    c = one_server(2)
    Plan(g, c, [Stage(["a", "c"], ["s0g0"]), Stage(["b", "d"], ["s0g1"])], 2)  # valid
    with pytest.raises(PipeplanError, match="back to stage"):
        Plan(g, c, [Stage(["a", "d"], ["s0g0"]), Stage(["b", "c"], ["s0g1"])], 2)
    d = Plan(g, c, [Stage(["a", "c"], ["s0g0"]), Stage(["b", "d"], ["s0g1"])], 2).to_dict()
    assert plan_from_dict(d).stages[1].nodes == ["b", "d"]
