"""DynPartition's pieces (dynamic/): trees and their generators, the networks, the
multi-device executor (its output equals single-device execution) and the cost model's
simulator against closed forms."""

import numpy as np
import pytest
import torch

from pipeplan.dynamic.simulator import DeviceSpec, machine, node_kinds, part_seconds, profile, simulate, simulate_jobs
from pipeplan.dynamic.executor import Executor, parse_devices
from pipeplan.dynamic.nets import build_net, reference
from pipeplan.dynamic.trees import (FUNCTION_NAMES, MATH_INPUTS, SST_MEAN_WORDS, Tree, binary_parse_tree,
                                    math_expression, sample_trees)
from pipeplan.errors import PipeplanError

CPU = DeviceSpec("cpu", 2e-6, 20e9, 2e9)

#: ((w0 w1) w2): leaves 0, 1, 3; node 2 joins 0 and 1; the root 4 joins 2 and 3
SMALL = Tree(((), (), (0, 1), (), (2, 3)), (5, 6, -1, 7, -1))


def test_tree_structure_by_hand():
    assert SMALL.parent.tolist() == [2, 2, 4, 4, -1]
    assert SMALL.depth.tolist() == [2, 2, 1, 1, 0]
    assert SMALL.inorder == (0, 2, 1, 4, 3)
    assert SMALL.leaves == (0, 1, 3)
    assert SMALL.subtree(2) == [0, 1, 2]


@pytest.mark.parametrize("children, words", [
    (((), (0,), (0,)), "exactly one parent"),
    (((1,), ()), "not an earlier node"),
    (((), ()), "exactly one parent"),
])
def test_malformed_trees_are_refused(children, words):
    with pytest.raises(PipeplanError, match=words):
        Tree(children, tuple([0] * len(children)))


def test_sst_like_trees_follow_the_treebank_lengths():
    trees = sample_trees("treelstm", 2000, seed=0)
    words = np.array([len(t.leaves) for t in trees])
    assert abs(words.mean() - SST_MEAN_WORDS) < 1.0
    assert all(t.n == 2 * len(t.leaves) - 1 and t.n <= 128 for t in trees)  # binary: 2w - 1 nodes
    assert all(len(ch) in (0, 2) for t in trees[:50] for ch in t.children)


def test_math_expressions_have_8_to_10_functions():
    rng = np.random.default_rng(3)
    for _ in range(200):
        t = math_expression(rng)
        inner = [i for i in range(t.n) if t.children[i]]
        assert 8 <= len(inner) <= 10
        assert all(len(t.children[i]) == FUNCTION_NAMES_ARITY[t.labels[i]] for i in inner)
        assert all(0 <= t.labels[i] < MATH_INPUTS for i in t.leaves)


FUNCTION_NAMES_ARITY = [2 if n in ("add", "sub", "mul") else 1 for n in FUNCTION_NAMES]


def test_unknown_network_and_bad_sizes():
    with pytest.raises(PipeplanError, match="unknown dynamic network"):
        sample_trees("resnet", 1, 0)
    with pytest.raises(PipeplanError, match="at least one word"):
        binary_parse_tree(0, np.random.default_rng(0))
    with pytest.raises(PipeplanError, match="width"):
        build_net("treelstm", -1)


def test_treelstm_node_by_hand():
    """Tai et al.'s binary TreeLSTM equations written out with the module's weights."""
    net = build_net("treelstm", 8)
    root, outputs = reference(net, SMALL)
    W, b = net.leaf.weight, net.leaf.bias

    def cell(gates, cl, cr):
        i, fl, fr, o, u = gates.chunk(5, dim=1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr
        return torch.sigmoid(o) * torch.tanh(c), c

    z = torch.zeros(1, 8)
    leaf = {k: cell(net.embedding.weight[[SMALL.labels[k] % net.vocab]] @ W.T + b, z, z) for k in (0, 1, 3)}
    Wi, bi = net.inner.weight, net.inner.bias
    h2, c2 = cell(torch.cat([leaf[0][0], leaf[1][0]], 1) @ Wi.T + bi, leaf[0][1], leaf[1][1])
    h4, c4 = cell(torch.cat([h2, leaf[3][0]], 1) @ Wi.T + bi, c2, leaf[3][1])
    assert torch.allclose(root, torch.cat([h4, c4], 1), atol=1e-6)
    assert torch.allclose(outputs[4], torch.log_softmax(h4 @ net.classifier.weight.T + net.classifier.bias, 1))


@pytest.mark.parametrize("net, width", [("treelstm", 16), ("mathfunc", 32)])
@pytest.mark.parametrize("mode, sync", [("threads", True), ("threads", False), ("devices", True),
                                        ("sequential", True)])
def test_executor_output_equals_single_device(net, width, mode, sync):
    """The must-show: random trees on random placements over three logical devices give
    exactly the single-device result, every node's output included."""
    model = build_net(net, width)
    ex = Executor(model, ["cpu", "cpu:1", "cpu:2"], mode, sync)
    rng = np.random.default_rng(7)
    for tree in sample_trees(net, 4, seed=11):
        want_root, want_outputs = reference(model, tree)
        place = rng.integers(3, size=tree.n)
        got = ex.run(tree, place, output_placement=rng.integers(3, size=tree.n))
        assert torch.equal(got.root, want_root)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(got.outputs, want_outputs))
        assert got.seconds > 0


def test_executor_bad_inputs():
    ex = Executor(build_net("mathfunc", 4), ["cpu", "cpu:1"])
    with pytest.raises(PipeplanError, match="2 devices given for a tree of 5 nodes"):
        ex.run(SMALL, [0, 1])
    with pytest.raises(PipeplanError, match="device index 2"):
        ex.run(SMALL, [0, 1, 2, 0, 0])
    with pytest.raises(PipeplanError, match="mode"):
        Executor(build_net("mathfunc", 4), ["cpu"], mode="fast")
    for text, words in (("cpu,gpu", "expected cpu"), ("cpu,cpu", "twice"), ("", "no device"),
                        ("cuda:7", "no such CUDA device")):
        with pytest.raises(PipeplanError, match=words):
            parse_devices(text)


def test_part_counts_by_hand():
    """TreeLSTM inner node: the [2w] x [2w, 5w] product is 2 x 2w x 5w FLOPs; its output
    a [w] x [w, 5] product."""
    k = node_kinds("treelstm", 64)
    assert k["inner"].flops == 2 * 128 * 320 and k["output"].flops == 2 * 64 * 5
    m = node_kinds("mathfunc", 1000)
    assert (m["add"].ops, m["add"].elements) == (1, 1000) and m["input"].ops == 0


def test_simulated_chain_on_one_device_is_the_sum_of_its_parts():
    chain = Tree(((), (0,), (1,), (2,)), (0, FUNCTION_NAMES.index("sin"), FUNCTION_NAMES.index("exp"),
                                          FUNCTION_NAMES.index("neg")))
    prof = profile(chain, "mathfunc", 10_000)
    m = machine(CPU, gpus=1)
    assert simulate(prof, [0] * 4, m) == pytest.approx(part_seconds(prof.state, CPU).sum())
    # on the GPU: the input's lookup is on the GPU too; no transfer
    gpu = m.devices[1]
    assert simulate(prof, [1] * 4, m) == pytest.approx(part_seconds(prof.state, gpu).sum())
    # the input on the CPU, the rest on the GPU: one PCIe copy of 10,000 floats
    lat, bw = m.latency[0, 1], m.bandwidth[0, 1]
    want = part_seconds(prof.state[:1], CPU).sum() + lat + 40_000 / bw + part_seconds(prof.state[1:], gpu).sum()
    assert simulate(prof, [0, 1, 1, 1], m) == pytest.approx(want)


def test_simulated_branches_run_in_parallel_on_two_devices():
    """sin(x0) + sin(x1): the two sines on two logical CPUs overlap, then the sum."""
    sin = FUNCTION_NAMES.index("sin")
    tree = Tree(((), (0,), (), (2,), (1, 3)), (0, sin, 1, sin, FUNCTION_NAMES.index("add")))
    prof = profile(tree, "mathfunc", 100_000)
    m = machine(DeviceSpec("cpu", 2e-6, 20e9, 1e9), logical_cpus=2)
    c = part_seconds(prof.state, m.devices[0])
    assert simulate(prof, [0, 0, 1, 1, 0], m) == pytest.approx(max(c[1], c[3]) + c[4])
    assert simulate(prof, [0] * 5, m) == pytest.approx(c.sum())


def test_treelstm_outputs_are_parts_of_their_own():
    prof = profile(SMALL, "treelstm", 64)
    m = machine(CPU, logical_cpus=2)
    s, o = part_seconds(prof.state, CPU), part_seconds(prof.output, CPU)
    assert simulate(prof, [0] * 5, m) == pytest.approx(s.sum() + o.sum())
    # every output on the second device: they overlap the states; the last output ends it
    assert simulate(prof, [0] * 5, m, output_placement=[1] * 5) == pytest.approx(s.sum() + o[4])


def test_stream_of_trees_queues_on_a_shared_device():
    prof = profile(SMALL, "treelstm", 32)
    m = machine(CPU)
    one = simulate(prof, [0] * 5, m)
    lat = simulate_jobs([(prof, [0] * 5, None, 0.0), (prof, [0] * 5, None, 0.0)], m)
    # one device, work-conserving: both done after twice the work; their nodes interleave
    assert max(lat) == pytest.approx(2 * one) and min(lat) >= one
    late = simulate_jobs([(prof, [0] * 5, None, 0.0), (prof, [0] * 5, None, 10 * one)], m)
    assert late == pytest.approx([one, one])


def test_stream_far_apart_trees_each_take_their_own_time():
    from pipeplan.dynamic.stream import poisson_arrivals, run_stream, simulate_stream

    trees = sample_trees("mathfunc", 6, seed=2)
    profs = [profile(t, "mathfunc", 1000) for t in trees]
    m = machine(CPU, logical_cpus=2)
    alone = [simulate(p, [0] * t.n, m) for t, p in zip(trees, profs)]
    arrivals = np.arange(6) * 10 * max(alone)  # no two trees overlap

    def on_cpu(k, t):
        return [0] * t.n, None

    out = simulate_stream(m, trees, profs, arrivals, on_cpu)
    assert out["p50_ms"] == pytest.approx(np.percentile(alone, 50) * 1e3)
    assert out["throughput_per_s"] == pytest.approx(6 / (arrivals[-1] + alone[-1]))
    # whole trees alternating between two devices at a high rate: latency falls against one device
    burst = np.zeros(6)
    one = simulate_stream(m, trees, profs, burst, on_cpu)
    two = simulate_stream(m, trees, profs, burst, lambda k, t: ([k % 2] * t.n, None))
    assert two["mean_ms"] < one["mean_ms"]
    real = run_stream(Executor(build_net("mathfunc", 1000), ["cpu", "cpu:1"], "devices"), trees,
                      poisson_arrivals(2000.0, 6, np.random.default_rng(0)), lambda k, t: ([k % 2] * t.n, None))
    assert real["trees"] == 6 and real["p99_ms"] >= real["p50_ms"] > 0
    with pytest.raises(PipeplanError, match="devices mode"):
        Executor(build_net("mathfunc", 4), ["cpu"], "threads").submit(trees[0], [0] * trees[0].n)
