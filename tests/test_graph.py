import numpy as np
import pytest

from pipeplan.errors import PipeplanError
from pipeplan.graph import (Graph, chains, graph_from_dict, graph_to_dict, is_chain, linearize,
                            load_graph, parse_pipedream, save_graph)
from pipeplan.graph.linearize import cut_bytes_for_order

from conftest import PROFILE_TABLE, profile_path


@pytest.mark.parametrize("name,nodes,edges", PROFILE_TABLE)
def test_profiles_load_with_their_counts(name, nodes, edges):
    path = profile_path(name)
    for spec in (str(path), str(path.parent)):
        g = load_graph(spec)
        assert (g.name, len(g), len(g.edges)) == (name, nodes, edges)
        assert np.all(g.fwd >= 0) and np.all(g.bwd >= 0)
        assert len(g.topo) == nodes


def test_profile_units_and_multi_output_activation():
    text = ("node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=8.0, parameter_size=0.000\n"
            "node2 -- LSTM(1, 1) -- forward_compute_time=2.5, backward_compute_time=5.0, "
            "activation_size=[100.0; 20.0; 3.0], parameter_size=64.000\n"
            "\tnode1 -- node2\n")
    g = parse_pipedream(text, "tiny")
    assert g.fwd[1] == pytest.approx(2.5e-3) and g.bwd[1] == pytest.approx(5e-3)
    assert g.act[1] == 123.0 and g.params[1] == 64.0 and g.desc[1] == "LSTM(1, 1)"
    assert g.edges == [(0, 1)]


@pytest.mark.parametrize("text,fragment", [
    ("node1 -- Conv -- forward_compute_time=x, backward_compute_time=1, activation_size=1, parameter_size=1", "not a number"),
    ("node1 -- forward_compute_time=1", "malformed node line"),
    ("node1 -- Conv -- forward_compute_time=1, backward_compute_time=1, activation_size=1", "missing parameter_size"),
    ("node1 -- Conv -- forward_compute_time=-1, backward_compute_time=1, activation_size=1, parameter_size=1", "negative"),
    ("node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n\tnode1", "malformed edge"),
    ("node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n\tnode1 -- node9", "unknown node"),
])
def test_malformed_profile_lines(text, fragment):
    with pytest.raises(PipeplanError, match=fragment):
        parse_pipedream(text, "bad", source="bad.txt")


def test_malformed_line_names_file_and_line():
    text = ("node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n"
            "node2 -- B -- forward_compute_time=oops, backward_compute_time=1, activation_size=1, parameter_size=1\n")
    with pytest.raises(PipeplanError, match=r"bad.txt:2"):
        parse_pipedream(text, "bad", source="bad.txt")


def test_cycle_is_rejected():
    line = "node{} -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n"
    text = line.format(1) + line.format(2) + "\tnode1 -- node2\n\tnode2 -- node1\n"
    with pytest.raises(PipeplanError, match="cycle"):
        parse_pipedream(text, "cyc")


def test_negative_time_in_graph():
    with pytest.raises(PipeplanError, match="negative"):
        Graph.chain("neg", [1.0, -1.0], [1.0, 1.0])


def test_missing_file_and_unknown_zoo():
    with pytest.raises(PipeplanError, match="no such file"):
        load_graph("/nonexistent/graph.txt")
    with pytest.raises(PipeplanError, match="unknown zoo model"):
        load_graph("zoo:no-such-model")


def test_json_round_trip(tmp_path):
    g = Graph.chain("c", [1e-3, 2e-3, 3e-3], [2e-3, 4e-3, 6e-3], params=[10, 20, 30], act=[5, 6, 7],
                    desc=["a", "", "c"], flops=[1.0, float("nan"), 3.0], meta={"k": 1})
    assert graph_from_dict(graph_to_dict(g)) == g
    save_graph(g, tmp_path / "g.json")
    assert load_graph(str(tmp_path / "g.json")) == g


@pytest.mark.parametrize("name", [t[0] for t in PROFILE_TABLE])
def test_json_round_trip_profiles(name, tmp_path):
    g = load_graph(str(profile_path(name)))
    save_graph(g, tmp_path / "g.json")
    assert load_graph(str(tmp_path / "g.json")) == g


def test_json_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PipeplanError, match="not valid JSON"):
        load_graph(str(bad))
    bad.write_text('{"format": "pipeplan.graph/1", "nodes": [{"id": "a", "fwd_s": 1}]}')
    with pytest.raises(PipeplanError, match="missing 'bwd_s'"):
        load_graph(str(bad))


def _diamond() -> Graph:
    from pipeplan.graph import NodeSpec

    nodes = [NodeSpec(x, 1.0, 2.0, 0.0, a) for x, a in (("a", 10), ("b", 20), ("c", 30), ("d", 40))]
    return Graph.from_nodes("diamond", nodes, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])


def test_chain_detection():
    assert is_chain(Graph.chain("c", [1, 1, 1], [1, 1, 1]))
    d = _diamond()
    assert not is_chain(d)
    assert chains(d) == [[0], [1], [2], [3]]
    from pipeplan.graph import NodeSpec

    nodes = [NodeSpec(x, 1, 1, 0, 0) for x in "abcde"]
    g = Graph.from_nodes("y", nodes, [("a", "b"), ("b", "c"), ("a", "d"), ("d", "e")])
    assert chains(g) == [[0], [1, 2], [3, 4]]


def test_linearization_cut_bytes():
    d = _diamond()
    lin = linearize(d)
    assert list(lin.order) == [0, 1, 2, 3]
    # after a: a's output (10) crosses; after a,b: a (to c) + b (to d); after a,b,c: b + c
    assert list(lin.cut_bytes) == [0, 10, 30, 50, 0]
    assert lin.fwd_cum[-1] == 4.0 and lin.bwd_cum[2] == 4.0


@pytest.mark.parametrize("name", [t[0] for t in PROFILE_TABLE])
def test_linearization_matches_brute_force(name):
    g = load_graph(str(profile_path(name)))
    lin = linearize(g)
    pos = np.empty(len(g), dtype=int)
    pos[lin.order] = np.arange(len(g))
    assert all(pos[u] < pos[v] for u, v in g.edges)  # a topological order
    for k in range(0, len(g) + 1, max(1, len(g) // 25)):
        crossing = {u for u, v in g.edges if pos[u] < k <= pos[v]}
        assert lin.cut_bytes[k] == pytest.approx(sum(g.act[u] for u in crossing))
    assert np.allclose(cut_bytes_for_order(g, lin.order), lin.cut_bytes)


def test_memory_fields_default_and_validate():
    from pipeplan.graph import NodeSpec

    g = Graph.chain("c", [1.0] * 3, [1.0] * 3, act=[8.0, 8.0, 4.0], inplace=[False, True, False])
    assert list(g.saved) == [8.0, 0.0, 4.0]  # an aliasing node's output is its producer's
    assert list(Graph.chain("c", [1.0], [1.0], act=[5.0]).inplace) == [False]
    nodes = [NodeSpec("a", 1.0, 1.0, 0.0, 8.0, saved=20.0), NodeSpec("b", 1.0, 1.0, 0.0, 8.0, inplace=True)]
    h = Graph.from_nodes("n", nodes, [("a", "b")])
    assert list(h.saved) == [20.0, 0.0] and list(h.inplace) == [False, True]
    doubled = h.scaled(act=2.0)
    assert list(doubled.saved) == [40.0, 0.0] and list(doubled.inplace) == [False, True]
    assert doubled != h and h.scaled() == h
    with pytest.raises(PipeplanError, match="in-place flags have 2 values for 3 nodes"):
        Graph.chain("c", [1.0] * 3, [1.0] * 3, inplace=[True, False])
    with pytest.raises(PipeplanError, match="node 'l1' has a negative or non-finite saved size"):
        Graph.chain("c", [1.0] * 2, [1.0] * 2, saved=[1.0, float("nan")])
