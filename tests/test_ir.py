"""The tensor IR, its derivation rules and propagation (Auto-MAP §3.2, §4.2): each rule on a
worked example computed by hand, conflicts, strided cuts, linkage groups of a two-layer MLP
by hand, the cost model against a closed form, the MILP against brute force."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pipeplan.cluster import load_cluster
from pipeplan.sim.formulas import allreduce_time
from pipeplan.sharding.cost import CostModel, op_seconds
from pipeplan.sharding.decisions import (Position, decide, decision_order, linkage_groups, placement_rewards, positions,
                                   score, vector)
from pipeplan.sharding.milp import solve
from pipeplan.sharding.program import export_module
from pipeplan.sharding.propagate import Propagator, bit, codes, placement_name
from pipeplan.sharding.rules import P, R, S

warnings.simplefilter("ignore")


def program(module: nn.Module, *inputs: torch.Tensor, names: tuple[str, ...] | None = None):
    torch.manual_seed(0)
    return export_module(module, inputs, type(module).__name__, names)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))).pow(2).mean()


@pytest.fixture(scope="module")
def mlp():
    prog = program(MLP(), torch.randn(4, 8), names=("x",))
    prop = Propagator(prog, 2)
    start, conflict = prop.start()
    assert conflict is None
    return prog, prop, start


def placements(prog, dom, *names):
    return [placement_name(dom[prog.by_source(n).id]) for n in names]


def test_program_marks_parameters_inputs_and_shapes(mlp):
    prog, _, _ = mlp
    assert [(t.source, t.shape) for t in prog.params] == [("fc1.weight", (16, 8)), ("fc1.bias", (16,)),
                                                         ("fc2.weight", (4, 16)), ("fc2.bias", (4,))]
    assert [(t.source, t.shape) for t in prog.inputs] == [("x", (4, 8))]
    assert [op.target for op in prog.ops] == ["permute", "addmm", "relu", "permute", "addmm", "pow", "mean"]


def test_column_then_row_parallel_linear_is_megatron(mlp):
    """fc1 cut by output features: its bias with it, fc2 by input features (partial sums),
    fc2's bias replicated (added once)."""
    prog, prop, start = mlp
    dom, conflict = prop.narrow(start, {prog.by_source("fc1.weight").id: bit(S(0))})
    assert conflict is None
    assert placements(prog, dom, "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias") == ["S(0)", "S(0)", "S(1)", "R"]
    out = prog.ops[4].outputs[0]  # fc2's addmm
    assert dom[out] == bit(P)


def test_cutting_a_contraction_of_a_replicated_input_is_pruned_at_the_start(mlp):
    """fc1.weight cut by input features needs x cut likewise; x is replicated (no gather)."""
    prog, prop, start = mlp
    assert not start[prog.by_source("fc1.weight").id] & bit(S(1))
    _, conflict = prop.narrow(start, {prog.by_source("fc1.weight").id: bit(S(1))})
    assert conflict is not None


def test_linkage_groups_of_a_two_layer_mlp_by_hand(mlp):
    prog, prop, start = mlp
    pos = positions(prog.params)
    assert [(prog.tensors[p.tensor].source, p.dim) for p in pos] == [("fc1.weight", 0), ("fc1.weight", 1), ("fc1.bias", 0),
                                               ("fc2.weight", 0), ("fc2.weight", 1), ("fc2.bias", 0)]
    assert vector(start, pos).tolist() == [-1, 0, -1, -1, -1, -1]
    link = linkage_groups(prop, start, pos)
    # fc1 column-parallel forces fc1.bias cut, fc2 row-parallel (so not by rows), fc2.bias whole
    assert link.forced[(0, True)] == {2: 1, 3: 0, 4: 1, 5: 0}
    # fc1 replicated: its bias too, and fc2 cannot be row-parallel (its input is whole)
    assert link.forced[(0, False)] == {2: 0, 4: 0}
    # fc2 by output features needs its input whole: fc1 replicated; fc2.bias cut with it
    assert link.forced[(3, True)] == {0: 0, 2: 0, 4: 0, 5: 1}
    assert link.forced[(5, False)] == {3: 0}
    assert decision_order(link, [0, 2, 3, 4, 5]) == [0, 2, 3, 4, 5]


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def test_elementwise_broadcast_follows_aligned_dimensions():
    prog = program(Scale(), torch.randn(4, 8))
    split = Propagator(prog, 2, inputs_splittable=True)
    start, _ = split.start()
    dom, conflict = split.narrow(start, {prog.by_source("w").id: bit(S(0))})
    assert conflict is None
    assert dom[prog.inputs[0].id] == bit(S(1)) and dom[prog.ops[0].outputs[0]] == bit(S(1))
    whole, _ = Propagator(prog, 2).start()  # x replicated: w cannot be cut (no slicing of x)
    assert whole[prog.by_source("w").id] == bit(R)


class Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x))).mean()


def test_convolutions_by_output_then_input_channels():
    prog = program(Convs(), torch.randn(2, 3, 8, 8))
    prop = Propagator(prog, 2)
    start, _ = prop.start()
    dom, conflict = prop.narrow(start, {prog.by_source("c1.weight").id: bit(S(0))})
    assert conflict is None
    assert placements(prog, dom, "c1.bias", "c2.weight", "c2.bias") == ["S(0)", "S(1)", "R"]
    conv2 = [op for op in prog.ops if op.target == "convolution"][1]
    assert dom[conv2.outputs[0]] == bit(P)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.emb(ids), dim=-1).sum()


def test_embedding_by_rows_is_partial_and_by_columns_cuts_the_output():
    prog = program(Embed(), torch.randint(0, 16, (2, 4)))
    prop = Propagator(prog, 2)
    start, _ = prop.start()
    emb = [op for op in prog.ops if op.target == "embedding"][0]
    rows, _ = prop.narrow(start, {prog.by_source("emb.weight").id: bit(S(0))})
    assert rows[emb.outputs[0]] == bit(P)
    cols, conflict = prop.narrow(start, {prog.by_source("emb.weight").id: bit(S(1))})
    assert conflict is None and cols[emb.outputs[0]] == bit(S(2))  # softmax along the cut: allowed


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).sum()


def test_layer_norm_scale_cannot_be_cut_over_a_replicated_input():
    prog = program(Norm(), torch.randn(4, 8))
    prop = Propagator(prog, 2)
    start, _ = prop.start()
    assert start[prog.by_source("norm.weight").id] == bit(R)


class Reduce(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(dim=1) + x.sum(dim=1)


def test_max_over_a_cut_dimension_conflicts_and_sum_gives_a_partial():
    prog = program(Reduce(), torch.randn(4, 6))
    prop = Propagator(prog, 2, inputs_splittable=True)
    start, _ = prop.start()
    x = prog.inputs[0].id
    assert codes(start[x]) == [R, S(0)]  # cutting dimension 1 conflicts at amax
    amax, total = [op for op in prog.ops if op.target in ("amax", "sum")]
    assert (bit(S(1)), bit(S(0))) not in prop.tables[amax.id].tuples
    assert (bit(S(1)), bit(P)) in prop.tables[total.id].tuples
    assert (bit(S(0)), bit(S(0))) in prop.tables[amax.id].tuples


class Heads(nn.Module):
    """[b, h, s, d] -> [b*h, s, d] -> bmm -> [b, h, s, s]: T5's attention layout."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        flat = q.reshape(b * h, s, d)
        scores = torch.bmm(flat, flat.transpose(1, 2))
        return scores.reshape(b, h, s, s).softmax(-1).sum()


def test_a_cut_of_an_inner_merged_dimension_comes_back_to_it():
    prog = program(Heads(), torch.randn(2, 4, 3, 5))
    prop = Propagator(prog, 2, inputs_splittable=True)
    start, _ = prop.start()
    q = prog.inputs[0].id
    heads, conflict = prop.narrow(start, {q: bit(S(1))})
    assert conflict is None
    back = [op for op in prog.ops if op.target == "view"][-1]
    assert placement_name(heads[back.outputs[0]]) == "S(1)"      # heads, not batch
    assert placement_name(heads[back.inputs[0]]) == "S(0/1)"     # merged b*h, cut by its inner part
    batch, _ = prop.narrow(start, {q: bit(S(0))})
    assert placement_name(batch[back.outputs[0]]) == "S(0)"


class FusedQKV(nn.Module):
    """GPT-2's attention input: one weight [n, 3n] (q | k | v, a Conv1D's [in, out]), its
    output split into q, k and v, each viewed as 2 heads of 4."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 24))
        self.bias = nn.Parameter(torch.randn(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, n = x.shape
        fused = torch.addmm(self.bias, x.view(-1, n), self.weight).view(b, s, 3 * n)
        q, k, v = (t.view(b, s, 2, n // 2) for t in fused.split(n, dim=2))
        return (q * k + v).sum()


def test_a_fused_qkv_cut_block_by_block_splits_into_head_cuts():
    """The fused weight cut by columns block by block (q's, k's and v's columns each cut in
    two: ``S(1/1)``) gives each of q, k and v cut by heads; a plain cut of the fused columns
    cannot split (each device would hold whole pieces), and back: a head cut of q forces the
    block-by-block cut of the weight."""
    prog = program(FusedQKV(), torch.randn(2, 3, 8))
    prop = Propagator(prog, 2)
    start, conflict = prop.start()
    assert conflict is None
    w = prog.by_source("weight").id
    assert start[w] & bit(S(1, 1)) and not start[w] & bit(S(1))
    dom, conflict = prop.narrow(start, {w: bit(S(1, 1))})
    assert conflict is None and placement_name(dom[prog.by_source("bias").id]) == "S(0/1)"
    split = next(op for op in prog.ops if op.target in ("split", "split_with_sizes"))
    assert [placement_name(dom[t]) for t in split.inputs + split.outputs] == ["S(2/1)"] + ["S(2)"] * 3
    heads = [op.outputs[0] for op in prog.ops if op.target == "view" and op.inputs[0] in split.outputs]
    assert [placement_name(dom[t]) for t in heads] == ["S(2)"] * 3
    back, conflict = prop.narrow(start, {heads[0]: bit(S(2))})
    assert conflict is None and back[w] == bit(S(1, 1))
    decided, conflict = decide(prop, start, Position(w, 1), partition=True)  # the search's action
    assert conflict is None and decided[w] == bit(S(1, 1))
    assert vector(decided, [Position(w, 0), Position(w, 1)]).tolist() == [0, 1]


def test_a_split_into_pieces_the_devices_do_not_divide_keeps_its_dimension_whole():
    prog = program(FusedQKV(), torch.randn(2, 3, 8))
    start, _ = Propagator(prog, 3).start()  # 8 columns a piece: no even cut in three
    assert not start[prog.by_source("weight").id] & (bit(S(1)) | bit(S(1, 1)))


def test_cost_of_megatron_mlp_is_its_closed_form(mlp):
    """Compute: every op cut in two but the loss's mean over the partial; communication: one
    all-reduce of fc2's partial output (x is an input: no gradient to all-reduce)."""
    prog, prop, start = mlp
    cluster = load_cluster("v100x4")
    model = CostModel(prop, cluster)
    dom, _ = prop.narrow(start, {prog.by_source("fc1.weight").id: bit(S(0))})
    got = model.evaluate(dom)
    whole = [op_seconds(op, prog) / cluster.devices[0].speed for op in prog.ops]
    # permute, addmm, relu, permute, addmm cut; pow and mean run on the all-reduced output
    expect_compute = sum(whole[:5]) / 2 + whole[5] + whole[6]
    fc2_out = prog.ops[4].outputs[0]
    nccl_latency = 3.6e-6 + 2 * 0.47e-6  # NCCL's ring: base + 2(p-1) steps inside a server
    expect_comm = allreduce_time(cluster, [0, 1], prog.tensors[fc2_out].numel * 4) + nccl_latency
    assert got.compute_s == pytest.approx(expect_compute)
    assert got.comm_s == pytest.approx(expect_comm)
    assert got.collectives == 1
    assert got.by_phase == {"forward": {"all_reduce": 1}, "backward": {}}


@pytest.mark.parametrize("devices, all_reduce_us, gather_us", [
    (2, 3.6 + 2 * 0.47, 3.6 + 0.47),
    (8, 3.6 + 14 * 0.47, 3.6 + 7 * 0.47),
    (16, 3.6 + 28 * 0.47 + 2 * 2.7, 3.6 + 14 * 0.47 + 2.7)])  # two servers: 2 (resp. 1) steps between them
def test_small_collectives_cost_nccl_ring_latency(devices, all_reduce_us, gather_us):
    """automap-c (8 V100 a server, links without latency of their own): a collective of a few
    bytes costs NCCL's ring latency (3.6 us, 0.47 us a step inside a server, 2.7 us a step
    between servers) on top of its bytes over the bandwidth."""
    cluster = load_cluster("automap-c")
    prog = program(MLP(), torch.randn(4, 8), names=("x",))
    model = CostModel(Propagator(prog, devices, gathers=True), cluster)
    bias = prog.by_source("fc2.bias").id  # 4 floats
    group = list(range(devices))
    assert model.ar[bias] == pytest.approx(allreduce_time(cluster, group, 16) + all_reduce_us * 1e-6)
    gather = allreduce_time(cluster, group, 16) / 2 + gather_us * 1e-6
    assert model.ag[bias] == pytest.approx(3 * gather)  # gathered, its gradient reduce-scattered, gathered again
    assert model.ar[bias] > 4e-6  # not the 0.08 ns of bandwidth alone


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 256),
                                    nn.ReLU(), nn.Linear(256, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).pow(2).mean()


def _brute_force(prop, start, model, tensors):
    """Every assignment of a placement to every tensor of ``tensors``: (best cost, best paper score).

    Depth first, one tensor at a time: narrowing is arc consistency, whose closure does not
    depend on the order the decisions come in, so each assignment gets the domains narrowing
    all of it at once gives, and a conflict among the first tensors is one of every assignment
    that extends them (the assignments' tree shares its prefixes' propagation; half the time)."""
    pos = positions(tensors)
    open_ = vector(start, pos) < 0
    best_cost, best_score = float("inf"), -1.0

    def visit(dom, k: int) -> None:
        nonlocal best_cost, best_score
        if k == len(tensors):
            c = model.evaluate(dom)
            if c.fits:
                best_cost = min(best_cost, c.step_s)
            best_score = max(best_score, score(vector(dom, pos)[open_]))
            return
        t = tensors[k]
        for code in codes(start[t.id]):
            narrowed, conflict = prop.narrow(dom, {t.id: bit(code)})
            if conflict is None:
                visit(narrowed, k + 1)

    visit(start, 0)
    return best_cost, best_score


@pytest.mark.parametrize("cluster", ["v100x4", "hier:servers=2,gpus=2,intra=10Gbps,inter=1Gbps"])
def test_milp_matches_brute_force(cluster):
    prog = program(Deep(), torch.randn(512, 64))
    prop = Propagator(prog, 4)
    start, _ = prop.start()
    model = CostModel(prop, load_cluster(cluster))
    best_cost, best_score = _brute_force(prop, start, model, prog.params)
    cost = solve(model, start, "cost")
    paper = solve(model, start, "paper", rewards=placement_rewards(start, positions(prog.params)))
    assert cost.optimal and cost.objective == pytest.approx(best_cost, rel=1e-9)
    assert paper.optimal and paper.objective == pytest.approx(best_score)
    dom, conflict = prop.narrow(start, {t: bit(c) for t, c in cost.placement.items()})
    assert conflict is None and model.evaluate(dom).step_s == pytest.approx(cost.objective)


@pytest.mark.slow
def test_milp_with_gathers_prices_its_plan_as_the_cost_model_does():
    """Hybrid rules (inputs split, gathers allowed): the program's optimum is what the cost
    model gives its full placement, and no assignment of the parameters and input beats it."""
    prog = program(Deep(), torch.randn(512, 64))
    prop = Propagator(prog, 4, inputs_splittable=True, gathers=True)
    start, _ = prop.start()
    model = CostModel(prop, load_cluster("hier:servers=2,gpus=2,intra=10Gbps,inter=1Gbps"))
    best_cost, _ = _brute_force(prop, start, model, prog.inputs + prog.params)
    res = solve(model, start, "cost")
    dom, conflict = prop.narrow(start, {t: bit(c) for t, c in res.placement.items()})
    assert conflict is None and model.evaluate(dom).step_s == pytest.approx(res.objective, rel=1e-9)
    assert res.objective <= best_cost * (1 + 1e-9)


class Views(nn.Module):
    """Each view-like op once, on a cut input: which dimension the cut lands on, by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [4, 6, 8]
        a = x.permute(2, 0, 1)           # [8, 4, 6]
        b = a.unsqueeze(1)               # [8, 1, 4, 6]
        c = b.squeeze(1)                 # [8, 4, 6]
        d = c[:, :, 1:3]                 # slice of dim 2
        e = torch.cat([d, d], dim=2)     # [8, 4, 4]
        f = e.transpose(0, 1)            # [4, 8, 4]
        g = torch.bmm(f, self.w)         # [4, 8, 3]
        return g.select(2, 0).sum()      # [4, 8]


def test_views_cat_and_bmm_move_the_cut_by_hand():
    prog = program(Views(), torch.randn(4, 6, 8))
    prop = Propagator(prog, 2, inputs_splittable=True)
    start, _ = prop.start()
    x = prog.inputs[0].id
    assert [op.target for op in prog.ops] == ["permute", "unsqueeze", "squeeze", "slice", "cat", "permute", "bmm",
                                              "select", "sum"]
    # x cut along its last dimension (8): permute -> dim 0, unsqueeze/squeeze keep it, slice and
    # cat act on another dimension, transpose -> dim 1, bmm: its m dimension -> output dim 1
    # (so w whole), select drops dimension 2, the sum is partial
    dom, conflict = prop.narrow(start, {x: bit(S(2))})
    assert conflict is None and dom[prog.by_source("w").id] == bit(R)
    assert [placement_name(dom[op.outputs[0]]) for op in prog.ops] == \
        ["S(0)", "S(0)", "S(0)", "S(0)", "S(0)", "S(1)", "S(1)", "S(1)", "P"]


def test_slicing_or_concatenating_along_the_cut_conflicts():
    prog = program(Views(), torch.randn(4, 6, 8))
    prop = Propagator(prog, 2, inputs_splittable=True)
    start, _ = prop.start()
    assert not start[prog.inputs[0].id] & bit(S(1))  # x's dim 1 becomes the sliced dimension


def test_ops_without_a_rule_run_only_replicated():
    class Sort(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(x, dim=1).values.sum()

    prog = program(Sort(), torch.randn(4, 6))
    prop = Propagator(prog, 2, inputs_splittable=True)
    start, _ = prop.start()
    assert "sort" in prop.unknown and start[prog.inputs[0].id] == bit(R)
