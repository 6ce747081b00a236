"""`pipeplan export`: ATen-op graphs through torch.export (runtime/aten_graph.py, docs/aten_graph.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pipeplan.cli import main
from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph, save_graph
from pipeplan.graph.model import Graph, NodeSpec
from pipeplan.graph.zoo import EFFICIENCY, REFERENCE_MEM_GBPS, REFERENCE_TFLOPS
from pipeplan.runtime.aten_graph import apply_measured, export_graph
from pipeplan.runtime.models import load_model

PEAK, MEM_BW = REFERENCE_TFLOPS * 1e12, REFERENCE_MEM_GBPS * 1e9 * EFFICIENCY["memory"]
BERT = ("hf:bert?num_hidden_layers=1&hidden_size=32&num_attention_heads=2&intermediate_size=64"
        "&vocab_size=100&seq=8&microbatch=2")


# -- models defined here (``tests/test_aten_graph.py:FACTORY`` specs) ---------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x)).reshape(x.shape)


class Tied(nn.Module):
    """A weight shared by two linears, an op of the root's own forward, a nested module."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(8, 8), Block(), nn.Linear(8, 8)
        self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(torch.relu(self.inp(x)))).sum(-1)


def tied() -> tuple[nn.Module, torch.Tensor]:
    return Tied(), torch.randn(4, 8)


def half() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(8, 16)).to(torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)


def needs_real() -> tuple[nn.Module, torch.Tensor]:
    m = nn.Linear(4, 4)
    float(m.weight.abs().max())  # .item(): impossible on the meta device
    return nn.Sequential(m), torch.randn(2, 4)


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x  # data-dependent control flow: torch.export refuses


def branchy() -> tuple[nn.Module, torch.Tensor]:
    return Branchy(), torch.randn(2, 4)


def _profile(spec: str, ids: list[str], fwd: list[float], bwd: list[float], microbatch: int = 4) -> Graph:
    """A layer graph like ``pipeplan profile``'s: these layer ids, times, spec and microbatch."""
    nodes = [NodeSpec(id=i, fwd=f, bwd=b, params=0.0, act=0.0) for i, f, b in zip(ids, fwd, bwd)]
    return Graph.from_nodes("p", nodes, list(zip(ids, ids[1:])), meta={"spec": spec, "microbatch": microbatch})


def _param_bytes(model: nn.Module) -> float:
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


@pytest.fixture(scope="module")
def mlp() -> Graph:
    return export_graph("example:mlp")


@pytest.fixture(scope="module")
def tied_graph() -> Graph:
    """``tied``'s graph, exported once for the tests that read it (none changes it)."""
    return export_graph(f"{__name__}:tied")


# -- the MLP ------------------------------------------------------------------------------------
def test_mlp_nodes_params_and_meta(mlp):
    model, x = load_model("example:mlp")
    assert len(mlp) == 15  # 8 addmm + 7 relu; the weights' transposes are folded views
    assert [d.split()[0] for d in mlp.desc].count("aten.addmm") == 8
    assert mlp.ids[:2] == ["0/addmm", "1/relu"] and len(set(mlp.ids)) == len(mlp)
    assert mlp.total_params == _param_bytes(model)
    assert mlp.params[0] == 4 * (256 * 512 + 512) and mlp.params[1] == 0
    meta = mlp.meta
    assert meta["source"] == "torch.export" and meta["granularity"] == "op" and meta["spec"] == "example:mlp"
    assert meta["microbatch"] == x.shape[0] == 64 and meta["reference_device"] == "V100"
    assert meta["materialized"] is False and "unused_param_bytes" not in meta


def test_mlp_addmm_roofline_and_backward_rule(mlp):
    i = mlp.index["2/addmm_1"]
    m, k, n = 64, 512, 512
    assert mlp.flops[i] == 2 * m * k * n and mlp.act[i] == m * n * 4
    moved = 4 * (n + m * k + k * n + m * n)  # bias, input, weight read; output written
    assert mlp.fwd[i] == pytest.approx(max(2 * m * k * n / (PEAK * EFFICIENCY["matmul"]), moved / MEM_BW))
    assert mlp.bwd[i] == pytest.approx(2 * mlp.fwd[i])       # input + weight gradient
    assert mlp.bwd[0] == pytest.approx(mlp.fwd[0])           # first layer: no input gradient
    r = mlp.index["1/relu"]
    assert mlp.flops[r] == 0 and mlp.fwd[r] == pytest.approx(2 * 64 * 512 * 4 / MEM_BW)
    assert mlp.bwd[r] == pytest.approx(mlp.fwd[r])           # element-wise: 1x


def test_mlp_edges_follow_the_data(mlp):
    assert mlp.topo == list(range(len(mlp)))  # a DAG (Graph raises on a cycle), here a chain
    assert ("0/addmm", "1/relu") in {(mlp.ids[u], mlp.ids[v]) for u, v in mlp.edges}
    assert mlp.edges == [(i, i + 1) for i in range(len(mlp) - 1)]


def test_microbatch_scales_activations(mlp):
    g = export_graph("example:mlp", microbatch=32)
    assert g.meta["microbatch"] == 32 and np.allclose(g.act * 2, mlp.act)
    assert (g.params == mlp.params).all()


# -- models defined here --------------------------------------------------------------------------
def test_module_paths_views_tied_weights(tied_graph):
    g = tied_graph
    paths = [nid.rsplit("/", 1)[0] for nid in g.ids]
    assert paths == ["inp", "model", "block.norm", "block.fc", "block", "out", "model"]
    assert not any(d.split()[0] in ("aten.view", "aten.permute", "aten.t") for d in g.desc)
    assert g.total_params == _param_bytes(Tied())  # the shared weight once, on its first user
    assert g.params[g.ids.index("inp/addmm")] == 4 * (64 + 8)
    assert g.params[[i for i, p in enumerate(paths) if p == "out"][0]] == 4 * 8  # its bias only
    edges = {(g.ids[u].split("/")[0], g.ids[v].split("/")[0]) for u, v in g.edges}
    assert ("model", "block.norm") in edges and ("model", "block") in edges  # the residual's two inputs


def test_dtype_sizes():
    g = export_graph(f"{__name__}:half")
    assert len(g) == 1 and g.params[0] == 2 * (8 * 16 + 16) and g.act[0] == 2 * 4 * 16
    assert "bfloat16" in g.desc[0]


def test_frozen_layers_have_no_weight_gradient():
    from pipeplan.sharding.program import quiet_export
    from pipeplan.runtime.aten_graph import graph_from_program

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[0].requires_grad_(False)
    g = graph_from_program(quiet_export(model.train(), (torch.randn(2, 4),)), "frozen")
    assert g.bwd[0] == 0 and g.bwd[1] == 0       # nothing upstream of the last linear trains
    assert g.bwd[2] == pytest.approx(g.fwd[2])   # its weight gradient only
    assert g.total_params == _param_bytes(model)  # frozen weights still take memory


def test_meta_device_and_real_fallback(tied_graph):
    assert tied_graph.meta["materialized"] is False
    g = export_graph(f"{__name__}:needs_real")
    assert g.meta["materialized"] is True and len(g) == 1


# -- a tiny BERT ----------------------------------------------------------------------------------
@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_tiny_bert_exports_a_valid_planner_input(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "bert.json"
    assert main(["export", BERT, "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    g = load_graph(str(out))
    model, _ = load_model(BERT)
    assert len(g) > 30 and g.meta["spec"] == BERT and g.meta["microbatch"] == 2
    assert g.total_params + g.meta.get("unused_param_bytes", 0) == _param_bytes(model)
    assert any(nid.startswith("1.attention.self.query/") for nid in g.ids)
    assert {d.split()[0] for d in g.desc} >= {"aten.embedding", "aten.addmm", "aten.bmm", "aten.native_layer_norm"}
    assert (g.fwd > 0).all() and (g.bwd >= 0).all() and np.isfinite(g.flops).all()
    assert main(["plan", "--model", str(out), "--cluster", "1080ti-4x2", "--microbatches", "4",
                 "--planner", "dp"]) == 0


# -- measured layer times -------------------------------------------------------------------------
def test_measured_scaling_on_mlp(tmp_path, mlp):
    from pipeplan.runtime.profiler import profile_model

    prof = profile_model("example:mlp", warmup=0, reps=1)
    path, out = tmp_path / "prof.json", tmp_path / "ops.json"
    save_graph(prof, path)
    assert main(["export", "example:mlp", "--out", str(out), "--measured", str(path)]) == 0
    g = load_graph(str(out))
    assert g.meta["measured"]["matched"] == prof.ids and g.meta["measured"]["unmatched"] == []
    for j, lid in enumerate(prof.ids):
        ops = [i for i, nid in enumerate(g.ids) if nid.split("/")[0] == lid]
        assert g.fwd[ops].sum() == pytest.approx(prof.fwd[j]) and g.bwd[ops].sum() == pytest.approx(prof.bwd[j])
    assert (g.act == mlp.act).all() and (g.params == mlp.params).all()


def test_measured_shares_in_proportion_and_keeps_the_rest(tied_graph):
    g = tied_graph
    block = [i for i, nid in enumerate(g.ids) if nid.startswith("block")]
    prof = _profile(f"{__name__}:tied", ["block", "nothing.here"], fwd=[1.0, 3.0], bwd=[2.0, 0.5])
    s = apply_measured(g, prof)
    assert s.fwd[block].sum() == pytest.approx(1.0) and s.bwd[block].sum() == pytest.approx(2.0)
    assert np.allclose(s.fwd[block] / s.fwd[block].sum(), g.fwd[block] / g.fwd[block].sum())
    rest = [i for i in range(len(g)) if i not in block]
    assert (s.fwd[rest] == g.fwd[rest]).all() and (s.bwd[rest] == g.bwd[rest]).all()
    assert s.meta["measured"]["matched"] == ["block"] and s.meta["measured"]["unmatched"] == ["nothing.here"]


# -- the command line's bad inputs ----------------------------------------------------------------
def _profile_json(path, spec: str, ids: list[str], microbatch: int = 4) -> str:
    save_graph(_profile(spec, ids, [1e-3] * len(ids), [2e-3] * len(ids), microbatch), path)
    return str(path)


def _bad_inputs(tmp_path) -> list[tuple[list[str], str]]:
    tied_spec = f"{__name__}:tied"
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 1}')
    return [
        (["example:nope"], "unknown example model"),
        (["no_such_module_xyz:f"], "cannot import"),
        ([f"{__name__}:branchy"], "torch.export failed"),
        (["example:mlp", "--out", str(tmp_path / "g.txt")], "extension"),
        (["example:mlp", "--out", str(tmp_path)], "is a directory"),
        (["example:mlp", "--out", "/proc/g.json"], "cannot create a file"),
        (["example:mlp", "--measured", str(tmp_path / "absent.json")], "--measured"),
        (["example:mlp", "--measured", str(bad)], "not a pipeplan graph"),
        (["example:mlp", "--measured", _profile_json(tmp_path / "p1.json", "example:cnn", ["0"])], "'example:cnn'"),
        ([tied_spec, "--measured", _profile_json(tmp_path / "p2.json", tied_spec, ["block"], 8)], "microbatch 8"),
        ([tied_spec, "--measured", _profile_json(tmp_path / "p3.json", tied_spec, ["x", "y"])], "none of its 2 layers"),
    ]


def test_cli_bad_inputs_exit_2_one_line_nothing_written(tmp_path, capsys):
    out = tmp_path / "out" / "g.json"
    for argv, fragment in _bad_inputs(tmp_path):
        full = ["export", *argv] + ([] if "--out" in argv else ["--out", str(out)])
        assert main(full) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and fragment in err and "Traceback" not in err, (argv, err)
        assert not out.exists() and not (tmp_path / "g.txt").exists()


def test_export_failure_is_a_pipeplan_error():
    with pytest.raises(PipeplanError, match="torch.export failed"):
        export_graph(f"{__name__}:branchy")
