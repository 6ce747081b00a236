"""Memory fields of the graph: in-place (aliasing) nodes and the bytes autograd saves, from
PipeDream profiles, native JSON and the PyTorch profiler (docs/memory.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, graph_from_dict, graph_to_dict, load_graph, parse_pipedream, save_graph
from pipeplan.graph.pipedream import is_aliasing
from pipeplan.runtime.profiler import profile_model

from conftest import profile_path

ONCE = {"warmup": 0, "reps": 1}


# -- PipeDream profiles ---------------------------------------------------------------------------
def _node_lines(path) -> dict[str, str]:
    """node id -> description, read straight from the file's text."""
    out = {}
    for line in path.read_text().splitlines():
        if line and not line[0].isspace():
            nid, desc, _ = line.split(" -- ")
            out[nid] = desc
    return out


def test_vgg16_inplace_nodes():
    path = profile_path("vgg16")
    g = load_graph(str(path))
    lines = _node_lines(path)
    relus = {nid for nid, d in lines.items() if d == "ReLU(inplace)"}
    assert len(relus) == 15
    assert {g.ids[i] for i in np.flatnonzero(g.inplace)} == relus | {"node34"}  # + View(-1)
    assert lines["node34"] == "View(-1)"
    # the claim in docs/memory.md: in-place ReLU outputs are 6.9 of VGG-16's 14.8 GB of outputs
    assert g.act.sum() == pytest.approx(14.76e9, rel=1e-3)
    assert sum(g.act[g.index[n]] for n in relus) == pytest.approx(6.94e9, rel=1e-3)


def test_vgg16_saved_bytes_by_layer_kind():
    """Closed form per layer of VGG-16 (docs/memory.md): a conv's output (kept by the in-place
    ReLU after it), none for in-place ReLUs and the View, max-pooling's output + int64 indices
    (3x), dropout's output (kept by the next Linear) + a 1-byte mask (1.25x), the last layer's
    output (kept by the loss), the input (kept by conv1)."""
    path = profile_path("vgg16")
    g = load_graph(str(path))
    factor = {"Input": 1.0, "Conv2d": 1.0, "ReLU": 0.0, "MaxPool2d": 3.0, "Size": 1.0, "View": 0.0,
              "Linear": 1.0, "Dropout": 1.25}
    expected = [factor[d.split("(")[0]] * a for d, a in zip(g.desc, g.act)]
    assert g.saved == pytest.approx(expected)
    assert g.saved.sum() == pytest.approx(9.37e9, rel=1e-3)


def _line(nid: str, desc: str, act: float) -> str:
    return (f"{nid} -- {desc} -- forward_compute_time=1.0, backward_compute_time=2.0, "
            f"activation_size={act}, parameter_size=0.0\n")


def test_saved_follows_consumers():
    """Linear -> ReLU() -> Dropout -> Linear: the first Linear's output is read by a ReLU that
    keeps its own output instead, so nothing keeps it; dropout's output is kept by the Linear."""
    text = (_line("a", "Linear(in_features=4, out_features=8, bias=True)", 64)
            + _line("b", "ReLU()", 64) + _line("c", "Dropout(p=0.5)", 64)
            + _line("d", "Linear(in_features=8, out_features=3, bias=True)", 24)
            + "\ta -- b\n\tb -- c\n\tc -- d\n")
    g = parse_pipedream(text, "t")
    assert list(g.inplace) == [False] * 4
    assert list(g.saved) == [0.0, 64.0, 64.0 + 16.0, 24.0]


@pytest.mark.parametrize("desc, aliasing", [
    ("ReLU(inplace)", True), ("ReLU(inplace=True)", True), ("ReLU(inplace=False)", False), ("ReLU()", False),
    ("LeakyReLU(negative_slope=0.01, inplace=True)", True), ("Dropout(p=0.5)", False),
    ("Dropout(p=0.5, inplace=True)", True), ("Add(inplace)", True), ("View(-1)", True),
    ("__getitem__(0)", True), ("Conv2d(3, 64, kernel_size=(3, 3))", False),
    ("Seq(  (0): ReLU(inplace=True)  (1): Linear(in_features=2, out_features=2, bias=True))", False),
])
def test_aliasing_descriptions(desc, aliasing):
    assert is_aliasing(desc) is aliasing


@pytest.mark.parametrize("desc", ["Hardtanh(min_val=-1.0, max_val=1.0, inplace=True)", "ReLU6(inplace=True)"])
def test_inplace_clone_keeps_a_copy(desc):
    """In-place Hardtanh/ReLU6 save a copy of their input (their backward needs what they overwrite)."""
    text = (_line("a", "Linear(in_features=4, out_features=8, bias=True)", 64) + _line("b", desc, 64)
            + _line("c", "Linear(in_features=8, out_features=3, bias=True)", 24) + "\ta -- b\n\tb -- c\n")
    g = parse_pipedream(text, "t")
    assert list(g.inplace) == [False, True, False] and list(g.saved) == [64.0, 64.0, 24.0]


# -- native JSON ------------------------------------------------------------------------------------
def test_native_round_trip_of_memory_fields(tmp_path):
    g = Graph.chain("c", [1.0] * 3, [2.0] * 3, act=[8.0, 8.0, 4.0], inplace=[False, True, False],
                    saved=[8.0, 0.0, 12.0])
    d = graph_to_dict(g)
    assert [n.get("inplace") for n in d["nodes"]] == [None, True, None]
    assert [n.get("saved_bytes") for n in d["nodes"]] == [None, None, 12.0]  # only where not the default
    save_graph(g, tmp_path / "g.json")
    back = load_graph(str(tmp_path / "g.json"))
    assert back == g and list(back.inplace) == [False, True, False] and list(back.saved) == [8.0, 0.0, 12.0]


def test_native_defaults_and_errors():
    base = {"format": "pipeplan.graph/1", "nodes": [
        {"id": "a", "fwd_s": 1, "bwd_s": 1, "act_bytes": 8}, {"id": "b", "fwd_s": 1, "bwd_s": 1, "act_bytes": 8,
                                                             "inplace": True}], "edges": [["a", "b"]]}
    g = graph_from_dict(json.loads(json.dumps(base)))
    assert list(g.inplace) == [False, True] and list(g.saved) == [8.0, 0.0]
    base["nodes"][1]["inplace"] = "yes"
    with pytest.raises(PipeplanError, match=r"nodes\[1\].*'inplace' must be true or false"):
        graph_from_dict(base)
    base["nodes"][1]["inplace"] = False
    base["nodes"][1]["saved_bytes"] = -1
    with pytest.raises(PipeplanError, match="saved_bytes.*-1 is out of range"):
        graph_from_dict(base)


# -- the PyTorch profiler ---------------------------------------------------------------------------
def _linear_act_linear(act: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 3)), torch.randn(2, 4)


def plain_relu():
    return _linear_act_linear(nn.ReLU())


def inplace_relu():
    return _linear_act_linear(nn.ReLU(inplace=True))


def inplace_hardtanh():
    return _linear_act_linear(nn.Hardtanh(inplace=True))


def flatten_model():
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 2)), \
        torch.randn(2, 1, 4, 4)


@pytest.mark.parametrize("factory, inplace, saved", [
    # batch 2, float32: Linear(4,8) -> 64 B, Linear(8,3) -> 24 B. Linear saves its input (the model's
    # input: not counted) and weight (state); ReLU saves its output; the loss keeps the last output.
    ("plain_relu", [False, False, False], [0, 64, 24]),
    # in place: the ReLU's output is the first Linear's storage, kept by the ReLU and the next Linear
    ("inplace_relu", [False, True, False], [64, 0, 24]),
    # in-place Hardtanh: autograd also keeps a copy of its input (64 B, allocated by the Hardtanh)
    ("inplace_hardtanh", [False, True, False], [64, 64, 24]),
    # conv: 2x2x4x4 floats = 256 B kept by the pool; pool: its 64 B output kept by the Linear
    # (through the Flatten view) + 16 int64 indices = 128 B; Flatten: a view; Linear: 16 B, loss
    ("flatten_model", [False, False, True, False], [256, 192, 0, 16]),
])
def test_profiler_saved_bytes_closed_form(factory, inplace, saved):
    g = profile_model(f"{__name__}:{factory}", **ONCE)
    assert list(g.inplace) == inplace
    assert list(g.saved) == saved


def test_profiler_saved_matches_every_storage_autograd_keeps():
    """Sum over nodes = the distinct storages saved by a forward + loss (not parameters, not the
    input), counted here with a separate hook on the example CNN."""
    g = profile_model("example:cnn", **ONCE)
    from pipeplan.runtime.models import load_model

    model, x = load_model("example:cnn", seed=0)
    static = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in static:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.train()(x).pow(2).mean()
    assert g.saved.sum() == sum(seen.values())
    assert list(np.flatnonzero(g.inplace)) == [10]  # Flatten
    assert g.saved.sum() < g.act.sum()
