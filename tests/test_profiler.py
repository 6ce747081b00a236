"""The profiler: built-in examples, a DAG with a skip edge, untraceable models, bad specs."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph, save_graph
from pipeplan.runtime.models import load_model
from pipeplan.runtime.profiler import profile_model

#: a warm-up and three timed repetitions (a median of three): each rep of the examples is a
#: full forward and backward pass, layer by layer, of real compute
FAST = {"warmup": 1, "reps": 3}


_WALLS: dict[str, float] = {}


class _Profiles(dict):
    """Example graphs, each profiled the first time a test asks for it."""

    def __missing__(self, name: str):
        start = time.perf_counter()
        self[name] = profile_model(f"example:{name}", **FAST)
        _WALLS[name] = time.perf_counter() - start
        return self[name]


@pytest.fixture(scope="module")
def profiles() -> dict:
    return _Profiles()


@pytest.fixture(scope="module")
def walls(profiles) -> dict[str, float]:
    """Seconds each of ``profiles`` took to make, from outside the profiler (filled as they are)."""
    return _WALLS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn"])
def test_examples_profile_into_valid_graphs(profiles, walls, name):
    g = profiles[name]
    model, x = load_model(f"example:{name}")
    children = dict(model.named_children())
    assert g.name == name and g.ids == list(children)
    assert g.edges == [(i, i + 1) for i in range(len(g) - 1)]
    assert (g.fwd > 0).all() and (g.bwd > 0).all()
    for i, nid in enumerate(g.ids):
        assert g.params[i] == 4 * sum(p.numel() for p in children[nid].parameters())
    with torch.no_grad():
        for i, child in enumerate(children.values()):
            x = child(x)
            assert g.act[i] == x.numel() * x.element_size()
    # the runtime's loss is timed apart and charged to the last layer's backward
    assert 0 < g.meta["loss_s"] <= g.bwd[-1]
    # each layer's median time is at most its summed repetitions, which all ran inside the
    # profile call: a unit off by 10^3 breaks this however loaded the machine is
    assert 0 < g.total_fwd + g.total_bwd < walls[name]
    assert 0 < g.meta["total_s"] < walls[name]
    meta = g.meta
    assert meta["spec"] == f"example:{name}" and meta["threads"] == 1 and meta["reps"] == 3
    assert meta["microbatch"] == load_model(f"example:{name}")[1].shape[0]
    assert meta["device"] == "cpu" and meta["torch"] == torch.__version__
    assert set(meta["spread"]) == set(g.ids)
    assert all(0 < lo <= hi for lo, hi in meta["spread"].values())


def test_json_round_trip(profiles, tmp_path):
    path = tmp_path / "mlp.json"
    save_graph(profiles["mlp"], path)
    assert load_graph(str(path)) == profiles["mlp"]


def test_microbatch_scales_activations(profiles):
    g = profile_model("example:mlp", microbatch=128, **FAST)
    base = profiles["mlp"]
    assert g.meta["microbatch"] == 2 * base.meta["microbatch"] == 128
    assert (g.act == 2 * base.act).all() and (g.params == base.params).all()


def test_threads_are_restored():
    before = torch.get_num_threads()
    profile_model("example:mlp", threads=2, warmup=0, reps=1)
    assert torch.get_num_threads() == before


# -- models given as package.module:factory (this test module is importable by pytest) ------------
class Skip(nn.Module):
    """inp -> a -> b -> c, and a's output added to b's before c (a skip edge a -> c)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.c(self.b(h) + h)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent Python control flow: not traceable
            return self.a(x)
        return x


class Reuse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.a(x))


def skip_model():
    return Skip(), torch.randn(4, 16)


def branchy_model():
    return Branchy(), torch.randn(4, 8)


def reuse_model():
    return Reuse(), torch.randn(4, 8)


def inplace_model():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2)), torch.randn(4, 8)


def test_inplace_activations_are_profiled():
    g = profile_model(f"{__name__}:inplace_model", **FAST)
    assert g.ids == ["0", "1", "2"] and (g.fwd > 0).all() and (g.bwd > 0).all()
    assert list(g.inplace) == [False, True, False]  # timed out of place, detected as it is
    assert list(g.saved) == [4 * 8 * 4, 0, 4 * 2 * 4]  # the ReLU keeps the first Linear's output


def test_skip_connection_gives_a_dag():
    g = profile_model(f"{__name__}:skip_model", **FAST)
    assert g.name == "skip_model" and g.ids == ["a", "b", "c"]
    assert sorted((g.ids[u], g.ids[v]) for u, v in g.edges) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert list(g.params) == [4 * (16 * 32 + 32), 4 * (32 * 32 + 32), 4 * (32 * 4 + 4)]
    assert list(g.act) == [4 * 4 * 32, 4 * 4 * 32, 4 * 4 * 4]
    assert (g.fwd > 0).all() and (g.bwd > 0).all()


class DictLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> dict:  # type: ignore[override]
        return {"out": super().forward(x)}


class ListLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> list:  # type: ignore[override]
        return [super().forward(x)]


class PackedOutputs(nn.Module):
    def __init__(self, layer: nn.Module, unpack) -> None:
        super().__init__()
        self.a, self.b, self.unpack = layer, nn.Linear(8, 2), unpack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.unpack(self.a(x)))


def dict_output_model():
    return PackedOutputs(DictLinear(8, 8), lambda out: out["out"]), torch.randn(4, 8)


def list_output_model():
    return PackedOutputs(ListLinear(8, 8), lambda out: out[0]), torch.randn(4, 8)


@pytest.mark.parametrize("factory, kind", [("dict_output_model", "dict"), ("list_output_model", "list")])
def test_layer_hiding_its_tensors_is_refused(factory, kind):
    """Backward hooks do not see a tensor inside a dict or a list: the layer's backward would
    be timed as zero, silently."""
    with pytest.raises(PipeplanError, match=f"layer 'a' returns a {kind}, not a tensor"):
        profile_model(f"{__name__}:{factory}", **FAST)


def test_untraceable_model_gets_advice():
    with pytest.raises(PipeplanError, match="nn.Sequential.*torch.fx"):
        profile_model(f"{__name__}:branchy_model", **FAST)


class BasicBlock(nn.Module):
    """A torchvision-style residual block: one ``self.relu`` called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)) + x)
        return self.fc(self.pool(h).flatten(1))


def basic_block():
    return BasicBlock(), torch.randn(2, 4, 8, 8)


def test_a_module_called_twice_is_a_layer_per_call():
    """Calls are layers, not modules: ``relu`` and ``relu#2``, each with its own times and
    sizes, in the data flow where each call happens."""
    g = profile_model(f"{__name__}:basic_block", **FAST)
    assert g.ids == ["conv1", "bn1", "relu", "conv2", "bn2", "relu#2", "pool", "fc"]
    assert [(g.ids[u], g.ids[v]) for u, v in sorted(g.edges)] == list(zip(g.ids, g.ids[1:]))
    assert (g.fwd > 0).all() and (g.bwd > 0).all()
    i, j = g.index["relu"], g.index["relu#2"]
    assert g.params[i] == g.params[j] == 0 and g.act[i] == g.act[j] == 2 * 4 * 8 * 8 * 4
    assert set(g.meta["backward_split_s"]) == set(g.ids) and g.tied == {}


def test_a_module_with_parameters_called_twice_is_tied():
    """``self.a(self.a(x))``: two layers sharing one weight, counted once, kept in one stage."""
    g = profile_model(f"{__name__}:reuse_model", **FAST)
    assert g.ids == ["a", "a#2"] and list(g.params) == [4 * (8 * 8 + 8), 0.0]
    assert g.tied == {"a.weight": ["a", "a#2"], "a.bias": ["a", "a#2"]}
    assert (g.bwd > 0).all()


@pytest.mark.parametrize("spec, message", [
    ("example:nope", "unknown example"), ("no_colon", "expected example:NAME"),
    ("no_such_module_xyz:f", "cannot import"), (f"{__name__}:missing", "has no"),
])
def test_bad_spec(spec, message):
    with pytest.raises(PipeplanError, match=message):
        profile_model(spec, **FAST)


def test_bad_arguments():
    with pytest.raises(PipeplanError, match="reps >= 1"):
        profile_model("example:mlp", reps=0)
    with pytest.raises(PipeplanError, match="device"):
        profile_model("example:mlp", device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_absent():
    with pytest.raises(PipeplanError, match="no CUDA device"):
        profile_model("example:mlp", device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_profile():
    g = profile_model("example:mlp", device="cuda", **FAST)
    assert (g.fwd > 0).all() and (g.bwd > 0).all() and g.meta["device"].startswith("cuda")


def wide_linears():
    return nn.Sequential(nn.Linear(512, 512, bias=False), nn.Linear(512, 512, bias=False), nn.ReLU()), \
        torch.randn(256, 512)


@pytest.mark.slow
def test_backward_splits_into_measured_input_and_weight_gradients(profiles):
    """``torch.autograd.grad`` w.r.t. the inputs, then w.r.t. the parameters, layer by layer:
    the first layer (its input is data) has no input gradient; a matmul between two layers has
    both; a parameter-free layer has no W; the model's share is stored for the simulator.
    Structure only: no bound on a ratio of two times, which a loaded machine moves."""
    g = profile_model(f"{__name__}:wide_linears", warmup=1, reps=3)
    split = g.meta["backward_split_s"]
    assert set(split) == set(g.ids)
    assert split["0"][0] == 0.0 and split["0"][1] > 0
    i, w, b = split["1"]
    assert i > 0 and w > 0 and b > 0
    assert split["2"][1] == 0.0 and split["2"][0] > 0
    assert 0.0 < g.meta["backward_input_fraction"] < 1.0
    assert g.meta["backward_split_cost"] > 0
    t = profiles["transformer"].meta
    assert t["backward_split_s"]["0"][0] == 0.0  # the embedding: its input is token ids
    assert 0.0 < t["backward_input_fraction"] < 1.0


def test_profile_records_its_input_and_run_warns_of_another(profiles):
    """A plan run on inputs other than the profile's (a longer sequence, other images) runs,
    but its prediction is for the profile's: ``run`` says so in one line."""
    from pipeplan.cluster import hierarchical
    from pipeplan.plan import Plan, Stage
    from pipeplan.runtime.executor import input_warnings

    g = profiles["mlp"]
    assert g.meta["input"] == {"sample_shape": [256], "dtype": "float32"}
    plan = Plan(g, hierarchical("local", 1, 1, 1e9, 1e9), [Stage(g.ids, ["s0g0"])], 2)
    assert input_warnings(plan, torch.randn(64, 256)) == []
    for x, now in ((torch.randn(64, 128), "128 float32"), (torch.randn(64, 256, dtype=torch.float64), "256 float64")):
        (line,) = input_warnings(plan, x)
        assert line.startswith(f"the model's input is {now} per sample but the plan's profile measured 256 float32")
    old = Plan(Graph.chain("m", [1.0], [1.0]), plan.cluster, [Stage(["l0"], ["s0g0"])], 2)
    assert input_warnings(old, torch.randn(4, 3)) == []  # a graph that does not say: nothing to compare


class TiedLM(nn.Module):
    """Input and output embeddings that share one weight (as GPT-2 ties them)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.mid, self.head = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)))


def tied_lm():
    return TiedLM(), torch.randint(0, 50, (4, 8))


def test_tied_weights_are_counted_once_and_recorded(tmp_path):
    g = profile_model(f"{__name__}:tied_lm", warmup=0, reps=1)
    assert list(g.params) == [4 * 50 * 16, 4 * (16 * 16 + 16), 0.0]
    assert g.total_params == 4 * sum(p.numel() for p in TiedLM().parameters())
    assert g.tied == {"emb.weight": ["emb", "head"]}
    save_graph(g, tmp_path / "g.json")
    assert load_graph(str(tmp_path / "g.json")).tied == g.tied


def _tied_chain(pairs: dict[str, list[str]]) -> Graph:
    """Eight equal layers l0..l7 in a chain, with the given tied groups."""
    from pipeplan.graph.model import NodeSpec

    nodes = [NodeSpec(id=f"l{i}", fwd=1e-3, bwd=2e-3, params=1e6, act=1e5) for i in range(8)]
    return Graph.from_nodes("tied", nodes, [(f"l{i}", f"l{i + 1}") for i in range(7)], meta={"microbatch": 4},
                            tied=pairs)


@pytest.mark.parametrize("planner", ["gpipe", "pipedream", "spp", "hetpipe", "megatron"])
@pytest.mark.parametrize("tied", [{"w": ["l3", "l4"]}, {"w": ["l0", "l7"]}, {"a": ["l1", "l2"], "b": ["l2", "l5"]}])
def test_no_planner_cuts_a_tied_parameter(planner, tied):
    """Whatever the planner's search returns, its plan keeps each tied group in one stage."""
    from pipeplan.cluster import hierarchical
    from pipeplan.planners.base import PlanOptions, run_planner

    g = _tied_chain(tied)
    plan, _ = run_planner(planner, g, hierarchical("c", 1, 4, 1e10, 1e10), PlanOptions(microbatches=8))
    stage_of = {nid: k for k, s in enumerate(plan.stages) for nid in s.nodes}
    for ids in tied.values():
        assert len({stage_of[nid] for nid in ids}) == 1, plan.stages
    assert plan.prediction["iteration_s"] > 0


def test_gpipe_cut_through_a_tied_pair_merges_just_those_stages():
    from pipeplan.cluster import hierarchical
    from pipeplan.planners.base import PlanOptions, run_planner

    plan, _ = run_planner("gpipe", _tied_chain({"w": ["l3", "l4"]}), hierarchical("c", 1, 4, 1e10, 1e10),
                          PlanOptions(microbatches=8))
    assert [s.nodes for s in plan.stages] == [["l0", "l1"], ["l2", "l3", "l4", "l5"], ["l6", "l7"]]
    assert [len(s.devices) for s in plan.stages] == [1, 2, 1]
    assert plan.extra["tied"] == {"merged_stages": {"w": [1, 2]}}


def test_plan_says_which_stages_a_tied_parameter_merged(tmp_path, capsys):
    from pipeplan.cli import main

    save_graph(_tied_chain({"w": ["l3", "l4"]}), tmp_path / "g.json")
    assert main(["plan", "--model", str(tmp_path / "g.json"), "--cluster", "hier:servers=1,gpus=4,intra=80Gbps,"
                 "inter=80Gbps", "--planner", "gpipe", "--microbatches", "8"]) == 0
    assert "tied parameters kept in one stage: w (the planner's stages 1-2 merged)" in capsys.readouterr().out


def test_a_model_whose_forward_never_returns_is_refused_at_the_timeout(tmp_path, monkeypatch, capsys):
    """profile --timeout: a user model that sleeps in its forward is one line, not a wait."""
    from pipeplan.cli import main

    (tmp_path / "hangs_forever.py").write_text(
        "import time, torch\nfrom torch import nn\n"
        "class Hang(nn.Module):\n    def forward(self, x):\n        time.sleep(3600)\n        return x\n"
        "def make():\n    return nn.Sequential(nn.Linear(4, 4), Hang()), torch.randn(2, 4)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["profile", "hangs_forever:make", "--timeout", "1", "--warmup", "0", "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not finish within 1 s (--timeout)" in err, err
