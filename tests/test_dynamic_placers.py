"""Placers of dynamic tree networks (``pipeplan.dynamic.placers``) against independent
oracles: ``optimal`` equals a plain brute force (``simulate`` on every placement from
``itertools.product``, no symmetry, no bounds); ``evaluate_many`` equals ``simulate``
placement by placement; ``count_canonical`` equals a count of placements up to relabelling
interchangeable devices; closed forms by hand from ``part_seconds``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from pipeplan.dynamic import placers
from pipeplan.dynamic.simulator import DeviceSpec, Machine, TreeProfile, machine, part_seconds, profile, simulate
from pipeplan.dynamic.trees import FUNCTION_NAMES, Tree, binary_parse_tree, sample_trees
from pipeplan.errors import PipeplanError

CPU = DeviceSpec("cpu", 2e-6, 20e9, 2e9)
M5 = machine(CPU, gpus=4)               # §8.2: one CPU and four GPUs
M2 = machine(CPU, logical_cpus=2)       # two logical CPUs: free transfers
M3 = machine(CPU, gpus=2)               # a CPU and two GPUs
F = {name: k for k, name in enumerate(FUNCTION_NAMES)}


def brute_force(prof: TreeProfile, m: Machine) -> float:
    n, D = len(prof.children), len(m.devices)
    return min(simulate(prof, p, m) for p in itertools.product(range(D), repeat=n))


def math_tree(shape: Tree, rng: np.random.Generator) -> Tree:
    """A MathFunc tree of ``shape``: inputs at the leaves, functions of the right arity inside."""
    binary, unary = [F["add"], F["sub"], F["mul"]], [F["sin"], F["cos"], F["exp"], F["tanh"], F["neg"]]
    labels = [int(rng.integers(4)) if not ch else int(rng.choice(binary if len(ch) == 2 else unary))
              for ch in shape.children]
    return Tree(shape.children, tuple(labels))


# a chain (sin(cos(x))), a pair, a lopsided and a balanced tree: 3 to 7 nodes
SHAPES = [Tree(((), (0,), (1,)), (0, F["cos"], F["sin"])),
          Tree(((), (), (0, 1)), (0, 1, F["mul"])),
          Tree(((), (), (0, 1), (), (2, 3)), (0, 1, F["add"], 2, F["sub"])),
          Tree(((), (), (0, 1), (), (), (3, 4), (2, 5)), (0, 1, F["add"], 2, 3, F["mul"], F["sub"]))]


def cases():
    """(name, tree, network, width, machine) small enough for brute force: <= 15,625
    placements. The profiles are built by the test that uses them (not while collecting)."""
    rng = np.random.default_rng(7)
    out = []
    for k, words in enumerate((2, 3, 3)):  # TreeLSTM parse trees of 3-5 nodes
        t = binary_parse_tree(words, rng)
        out.append((f"treelstm150-{t.n}-m5", t, "treelstm", 150, M5))
        out.append((f"treelstm1024-{t.n}-m2", t, "treelstm", 1024, M2))
    out.append(("treelstm1024-7-m3", binary_parse_tree(4, rng), "treelstm", 1024, M3))
    for t in SHAPES:
        m5 = M5 if t.n <= 6 else M3
        out.append((f"mathfunc1e5-{t.n}-m{len(m5.devices)}", t, "mathfunc", 100_000, m5))
        out.append((f"mathfunc1-{t.n}-m2", t, "mathfunc", 1, M2))
    out.append(("treelstm150-5-m5-overhead", binary_parse_tree(3, rng), "treelstm", 150,
                replace(M5, part_overhead_s=5e-6)))
    return out


CASES = cases()


@pytest.mark.parametrize("name,tree,net,width,m", CASES, ids=[c[0] for c in CASES])
def test_optimal_equals_brute_force(name, tree, net, width, m):
    prof = profile(tree, net, width)
    best, seconds = placers.optimal(prof, m)
    assert len(best) == len(prof.children)
    assert seconds == simulate(prof, best, m)
    assert seconds == brute_force(prof, m)


def test_evaluate_many_equals_simulate():
    rng = np.random.default_rng(3)
    for net, width, m in [("treelstm", 150, M5), ("treelstm", 1024, replace(M3, part_overhead_s=3e-6)),
                          ("mathfunc", 1, M2), ("mathfunc", 100_000, M5)]:
        for t in sample_trees(net, 3, 5):
            prof = profile(t, net, width)
            X = rng.integers(len(m.devices), size=(60, t.n))
            X[0] = 0  # one device: every part waits for the one before
            assert placers.evaluate_many(prof, m, X).tolist() == [simulate(prof, x, m) for x in X]


def orbit_count(n: int, m: Machine) -> int:
    """Placements up to permutations of interchangeable devices, found by relabelling each."""
    classes = placers.interchangeable(m)
    seen = set()
    for p in itertools.product(range(len(m.devices)), repeat=n):
        relabel = {}
        for c in classes:
            used = [d for d in dict.fromkeys(p) if d in c]  # first-use order
            relabel.update(zip(used, c))
        seen.add(tuple(relabel[d] for d in p))
    return len(seen)


def test_canonical_counts():
    assert placers.interchangeable(M5) == [[0], [1, 2, 3, 4]]
    assert placers.interchangeable(machine(CPU, gpus=2, logical_cpus=2)) == [[0, 1], [2, 3]]
    odd = machine(CPU, gpus=3)
    odd.latency[1, 2] = odd.latency[2, 1] = 1e-3  # GPUs 0 and 1 share a slow link
    assert placers.interchangeable(odd) == [[0], [1, 2], [3]]
    for n, m in [(5, M5), (6, M2), (4, machine(CPU, gpus=2, logical_cpus=2)), (4, odd)]:
        count = placers.count_canonical(n, m)
        assert count == orbit_count(n, m)
        rows = np.concatenate(list(placers.canonical_placements(n, m, batch=7)))
        assert len({tuple(r) for r in rows.tolist()}) == count == len(rows)
    # one CPU + 4 interchangeable GPUs: sum over the CPU's nodes of Stirling numbers S(n-k, <=4)
    stirling = {(0, 0): 1}
    for a in range(1, 12):
        for b in range(0, a + 1):
            stirling[a, b] = b * stirling.get((a - 1, b), 0) + stirling.get((a - 1, b - 1), 0)
    from math import comb
    assert placers.count_canonical(11, M5) == sum(comb(11, k) * sum(stirling.get((11 - k, j), 0) for j in range(5))
                                                  for k in range(12)) == 2_079_475


def test_closed_form_two_leaves_two_cpus():
    """Two leaves and a root on two identical logical CPUs, free transfers: the leaves run
    side by side, so the best time is max(leaf costs) + root cost."""
    rows = np.array([[3, 4e6, 2e4], [5, 1e6, 6e4], [2, 8e6, 1e4]], dtype=float)
    children = ((), (), (0, 1))
    prof = TreeProfile(rows, None, 600, 600, children, np.array([2, 2, -1]))
    a, b, r = (op * 2e-6 + fl / 20e9 + el / 2e9 for op, fl, el in rows)
    assert np.allclose(part_seconds(rows, CPU), [a, b, r], rtol=1e-15)
    best, seconds = placers.optimal(prof, M2)
    assert seconds == pytest.approx(max(a, b) + r, rel=1e-12)
    assert best[0] != best[1]
    assert simulate(prof, [0, 0, 0], M2) == pytest.approx(a + b + r, rel=1e-12)


@pytest.mark.parametrize("net,width", [("treelstm", 150), ("treelstm", 1024), ("mathfunc", 100_000)])
def test_chain_goes_to_the_faster_device(net, width):
    """A chain on a slow and a uniformly faster device with free links: everything on the
    fast one (every placement's time is the sum of its parts' costs); time = the sum there."""
    fast = DeviceSpec("fast", 1e-6, 40e9, 4e9)
    m = Machine([CPU, fast], np.zeros((2, 2)), np.full((2, 2), np.inf))
    t = Tree(((), (0,), (1,), (2,), (3,)), (0, F["sin"], F["cos"], F["exp"], F["neg"]))
    prof = profile(t, net, width)
    costly = [i for i in range(t.n) if part_seconds(prof.state[i:i + 1], CPU)[0] > 0]
    assert costly
    want = part_seconds(prof.state, fast).sum()
    if prof.output is not None:
        want += part_seconds(prof.output, fast).sum()
    h = placers.heft(prof, m)
    best, seconds = placers.optimal(prof, m)
    for p in (h, best):
        assert all(p[i] == 1 for i in costly)
        assert simulate(prof, p, m) == pytest.approx(want, rel=1e-12)
    assert seconds == pytest.approx(want, rel=1e-12)


def test_heft_vs_optimal():
    ratios = []
    for name, tree, net, width, m in CASES:
        prof = profile(tree, net, width)
        h = placers.heft(prof, m)
        assert len(h) == len(prof.children) and 0 <= min(h) and max(h) < len(m.devices)
        _, opt = placers.optimal(prof, m)
        hs = simulate(prof, h, m)
        assert hs >= opt
        assert hs <= 2.0 * opt, name
        ratios.append(hs / opt)
        plain = simulate(prof, placers.heft(prof, m, lookahead=False), m)
        assert plain >= opt
    assert np.mean(ratios) < 1.15


def test_local_search_improves():
    rng = np.random.default_rng(0)
    for net, width in [("treelstm", 1024), ("mathfunc", 100_000)]:
        t = sample_trees(net, 1, 2)[0]
        prof = profile(t, net, width)
        start = placers.static(t.n, 0, len(M5.devices))
        p, seconds = placers.local_search(prof, M5, start, rng, evaluations=400)
        assert seconds == simulate(prof, p, M5) <= simulate(prof, start, M5)
        assert seconds < simulate(prof, start, M5)  # the CPU alone is not a local optimum here


def test_optimal_beats_or_ties_every_baseline_on_a_mathfunc_tree():
    t = math_tree(binary_parse_tree(4, np.random.default_rng(1)), np.random.default_rng(2))
    prof = profile(t, "mathfunc", 100_000)
    stats = {}
    best, seconds = placers.optimal(prof, M5, stats=stats)
    assert stats["canonical"] == placers.count_canonical(t.n, M5) and stats["scored"] <= stats["canonical"]
    rng = np.random.default_rng(0)
    baselines = [placers.static(t.n, d) for d in range(5)] + [placers.random_placement(t.n, 5, rng) for _ in range(50)]
    assert all(seconds <= simulate(prof, p, M5) for p in baselines + [placers.heft(prof, M5)])


def test_baselines_are_valid():
    assert placers.static(4, 2) == [2, 2, 2, 2]
    assert placers.static(3, 4, devices=5) == [4, 4, 4]
    rng = np.random.default_rng(0)
    p = placers.random_placement(500, 5, rng)
    assert len(p) == 500 and set(p) == set(range(5))
    q = placers.random_placement(200, [0, 3], rng)
    assert set(q) == {0, 3}


def test_bad_inputs():
    prof = profile(binary_parse_tree(3, np.random.default_rng(0)), "treelstm", 150)
    with pytest.raises(PipeplanError, match="device 5"):
        placers.static(4, 5, devices=5)
    with pytest.raises(PipeplanError):
        placers.static(4, -1)
    with pytest.raises(PipeplanError):
        placers.static(0, 0)
    with pytest.raises(PipeplanError):
        placers.random_placement(3, [], np.random.default_rng(0))
    with pytest.raises(PipeplanError, match="outside"):
        placers.evaluate_many(prof, M5, [[0, 1, 2, 3, 5]])
    with pytest.raises(PipeplanError, match="5 nodes"):
        placers.local_search(prof, M5, [0, 0], np.random.default_rng(0), 10)
    big = profile(binary_parse_tree(20, np.random.default_rng(0)), "treelstm", 150)
    with pytest.raises(PipeplanError, match=r"39 nodes has [\d,]+ canonical placements") as err:
        placers.optimal(big, M5, max_work=1000)
    assert "\n" not in str(err.value)


def test_random_search_and_annealing_reach_the_optimum_on_a_tiny_tree():
    """Three nodes on two devices: 8 placements; enough evaluations find the brute-force best."""
    tree = Tree(((), (), (0, 1)), (1, 2, -1))
    prof = profile(tree, "treelstm", 512)
    m = machine(DeviceSpec("cpu", 2e-6, 20e9, 2e9), gpus=1)
    brute = min(simulate(prof, list(p), m) for p in itertools.product(range(2), repeat=3))
    rng = np.random.default_rng(0)
    assert placers.random_search(prof, m, rng, 200)[1] == pytest.approx(brute)
    place, s = placers.annealing(prof, m, [0, 0, 0], rng, 300)
    assert s == pytest.approx(brute) and simulate(prof, place, m) == pytest.approx(s)
    with pytest.raises(PipeplanError, match="evaluations"):
        placers.annealing(prof, m, [0, 0, 0], rng, 0)
