"""Operator granularity of the analytic zoo (``zoo:NAME?granularity=op``, graph/zoo_ops.py)."""

from __future__ import annotations


import numpy as np
import pytest

from pipeplan.errors import PipeplanError
from pipeplan.graph import linearize, load_graph, zoo
from pipeplan.graph.model import Graph
from pipeplan.graph.scale import with_microbatch

OP_MODELS = ["bert-large", "bert-48", "transformer", "t5-base", "t5-3b", "t5-11b"]
# small variants too: odd sizes, one layer, encoder and decoder of different lengths
VARIANTS = [(name, {}) for name in OP_MODELS] + [
    ("bert-large", {"layers": "1", "seq": "33", "microbatch": "3"}),
    ("transformer", {"layers": "1", "tgt_seq": "17"}),
    ("t5-base", {"layers": "2", "seq": "64", "tgt_seq": "40"}),
    ("t5-11b", {"layers": "1", "microbatch": "2"}),
]
VARIANT_IDS = [f"{n}-{'-'.join(f'{k}{v}' for k, v in o.items()) or 'defaults'}" for n, o in VARIANTS]


def layer_of(node_id: str) -> str:
    return node_id.rsplit("/", 1)[0]


def both(name: str, options: dict) -> tuple[Graph, Graph]:
    """(layer-level graph, op-level graph) of one zoo model."""
    return zoo.build(name, options), zoo.build(name, {**options, "granularity": "op"})


@pytest.fixture(scope="module", params=VARIANTS, ids=VARIANT_IDS)
def pair(request) -> tuple[Graph, Graph]:
    return both(*request.param)


def test_layer_granularity_is_the_default():
    for name in OP_MODELS + ["resnet50", "xlnet-large"]:
        g = zoo.build(name, {})
        assert g == zoo.build(name, {"granularity": "layer"})
        assert g.meta["granularity"] == "layer"
    assert zoo.build("bert-48", {"granularity": " Layer "}).meta["granularity"] == "layer"


def test_ids_name_their_layer_and_layers_are_contiguous(pair):
    layer, ops = pair
    assert ops.meta["granularity"] == "op" and ops.name == layer.name
    assert all("/" in i for i in ops.ids)
    # the ops are listed layer by layer in the layer graph's order, and that listing is the
    # graph's topological order (so a cut between two layers is a cut of Graph.topo)
    owners = [layer_of(i) for i in ops.ids]
    firsts = list(dict.fromkeys(owners))
    assert firsts == layer.ids
    assert owners == sorted(owners, key=firsts.index)
    assert ops.topo == list(range(len(ops)))
    assert all(u < v for u, v in ops.edges)
    assert all(ops.desc) and np.all(ops.act > 0)
    assert np.all(np.isfinite(ops.flops)) and np.all(ops.fwd > 0) and np.all(ops.bwd > 0)


def test_ops_of_a_layer_sum_to_the_layer(pair):
    layer, ops = pair
    owners = np.array([layer.index[layer_of(i)] for i in ops.ids])
    for what in ("fwd", "bwd", "flops", "params"):
        sums = np.bincount(owners, weights=getattr(ops, what), minlength=len(layer))
        np.testing.assert_allclose(sums, getattr(layer, what), rtol=1e-9, atol=0, err_msg=what)
    assert ops.total_params == layer.total_params


def test_bytes_crossing_layer_boundaries_are_the_layer_activations(pair):
    layer, ops = pair
    cut = linearize(ops).cut_bytes
    owners = [layer_of(i) for i in ops.ids]
    ends = [k + 1 for k in range(len(ops)) if k + 1 == len(ops) or owners[k + 1] != owners[k]]
    expected = layer.act.copy()
    expected[-1] = 0.0                                    # nothing crosses the end of the model
    if "pooler" in layer.index:
        # BERT's pooler output feeds nothing (the SQuAD head reads the sequence output only),
        # while the layer graph counts it in the pooler's act: the op graph is B x d smaller
        p = layer.index["pooler"]
        expected[p] -= layer.meta["microbatch"] * layer.meta["d_model"] * zoo.BYTES
    np.testing.assert_allclose(cut[ends], expected, rtol=1e-12)


def test_cuts_inside_a_layer_carry_what_is_live():
    g = zoo.build("bert-large", {"layers": "2", "granularity": "op"})
    cut, T, d = linearize(g).cut_bytes, 4 * 384, 1024
    after = {g.ids[u]: k + 1 for k, u in enumerate(g.topo)}
    # after Q: the layer input (read by K, V and the residual add) and Q itself
    assert cut[after["layer2/attn.q"]] == 2 * T * d * 4
    # after the softmax: the layer input, V and the probabilities (B x h x S x S)
    assert cut[after["layer2/attn.softmax"]] == 2 * T * d * 4 + 4 * 16 * 384 * 384 * 4
    # after the FFN activation: its output and norm1's output (read by the residual add)
    assert cut[after["layer2/ffn.act"]] == (T * 4096 + T * d) * 4


def test_node_counts():
    per_layer = {"bert": 14, "transformer": 14 + 23, "t5": 15 + 24}
    counts = {name: len(zoo.build(name, {"granularity": "op"})) for name in OP_MODELS}
    assert counts == {"bert-large": 24 * per_layer["bert"] + 9, "bert-48": 681,
                      "transformer": 6 * per_layer["transformer"] + 6,
                      "t5-base": 12 * per_layer["t5"] + 6, "t5-3b": 942, "t5-11b": 942}
    assert counts["bert-48"] == 48 * per_layer["bert"] + 9
    assert counts["t5-11b"] == 24 * per_layer["t5"] + 6


def test_a_bert_q_projection_by_hand():
    g = zoo.build("bert-large", {"granularity": "op"})
    B, S, d, h = 4, 384, 1024, 16
    i = g.index["layer14/attn.q"]
    flops = 2 * B * S * d * d
    assert g.flops[i] == flops
    assert g.act[i] == B * S * d * 4
    assert g.params[i] == (d * d + d) * 4
    assert g.fwd[i] == pytest.approx(flops / (15.7e12 * 0.70), rel=1e-12)
    assert g.bwd[i] == pytest.approx(2 * g.fwd[i], rel=1e-12)
    assert g.desc[i] == "matmul [1536x1024]x[1024x1024] + bias"
    assert [g.ids[p] for p in g.pred[i]] == ["layer13/norm2"]
    s = g.index["layer14/attn.scores"]
    assert g.flops[s] == 2 * B * h * S * S * (d // h) and g.act[s] == B * h * S * S * 4
    assert g.params[s] == 0 and g.desc[s] == "bmm Q.K^T [64x384x64]x[64x64x384]"
    sm = g.index["layer14/attn.softmax"]
    assert g.flops[sm] == 0 and g.fwd[sm] == pytest.approx(2 * B * h * S * S * 4 / 360e9)


def preds(g: Graph, nid: str) -> set[str]:
    return {g.ids[p] for p in g.pred[g.index[nid]]}


def test_bert_wiring():
    g = zoo.build("bert-large", {"layers": "3", "granularity": "op"})
    for op in ("attn.q", "attn.k", "attn.v"):
        assert preds(g, f"layer2/{op}") == {"layer1/norm2"}
    assert preds(g, "layer2/attn.residual") == {"layer2/attn.out", "layer1/norm2"}
    assert preds(g, "layer2/ffn.residual") == {"layer2/ffn.fc2", "layer2/norm1"}
    assert preds(g, "layer1/attn.q") == {"embed/norm"}
    assert preds(g, "embed/sum") == {"embed/word", "embed/position", "embed/token_type"}
    assert preds(g, "pooler/dense") == preds(g, "head/span") == {"layer3/norm2"}


@pytest.mark.parametrize("name", ["t5-base", "transformer"])
def test_encoder_decoder_wiring(name):
    g = zoo.build(name, {"layers": "3", "granularity": "op"})
    t5 = name.startswith("t5")
    memory = "enc3/final_norm" if t5 else "enc3/norm2"
    for i in (1, 2, 3):
        assert preds(g, f"dec{i}/cross.k") == preds(g, f"dec{i}/cross.v") == {memory}
    assert sum(memory in preds(g, v) for v in g.ids) == 6          # only the cross K and V
    if t5:  # pre-norm: Q, K, V read the normed stream, the residual add the stream itself
        assert preds(g, "enc2/attn.q") == preds(g, "enc2/attn.k") == {"enc2/norm1"}
        assert preds(g, "enc2/norm1") == {"enc1/ffn.residual"}
        assert preds(g, "enc2/attn.residual") == {"enc2/attn.out", "enc1/ffn.residual"}
        assert preds(g, "enc2/attn.softmax") == {"enc2/attn.bias"}
        assert preds(g, "dec2/cross.q") == {"dec2/norm2"}
        assert preds(g, "dec2/cross.residual") == {"dec2/cross.out", "dec2/attn.residual"}
        assert preds(g, "lm_head/proj") == {"dec3/final_norm"}
        assert g.params[g.index["enc1/attn.bias"]] == 32 * 12 * 4
        assert g.params[g.index["enc2/attn.bias"]] == 0
    else:   # post-LN
        assert preds(g, "enc2/attn.q") == {"enc1/norm2"}
        assert preds(g, "dec2/cross.q") == {"dec2/norm1"}
        assert preds(g, "dec2/cross.residual") == {"dec2/cross.out", "dec2/norm1"}
        assert preds(g, "lm_head/proj") == {"dec3/norm3"}
    assert not g.pred[g.index["dec_embed/word"]]
    shared = g.meta["shared_weights"][0]
    assert shared["owner"] == "embed/word" and g.params[g.index["embed/word"]] == shared["bytes"]
    assert all(g.params[g.index[u]] == 0 for u in shared["users"])


def test_spec_string_and_microbatch_rebuild():
    g = load_graph("zoo:t5-11b?granularity=op&layers=4")
    assert g == zoo.build("t5-11b", {"layers": "4", "granularity": "op"})
    assert len(g) == 4 * 39 + 6
    # a zoo op graph is rebuilt, not scaled, for another microbatch size
    h = with_microbatch(g, 8)
    assert h == zoo.build("t5-11b", {"layers": "4", "granularity": "op", "microbatch": "8"})


def test_t5_11b_builds_whole():
    """Every op of T5-11B's 24 + 24 blocks (its build time is a benchmark's, not a test's)."""
    g = zoo.build("t5-11b", {"granularity": "op"})
    assert len(g) == 942


def test_describe_lists_granularity_as_a_string_option():
    for entry in zoo.describe():
        offers = entry["name"] in OP_MODELS
        assert entry["granularities"] == (["layer", "op"] if offers else ["layer"])
        assert ("granularity" in entry["defaults"]) == offers
        assert entry["defaults"].get("granularity", "layer") == "layer"
        assert all(isinstance(v, int) for k, v in entry["defaults"].items() if k != "granularity")


@pytest.mark.parametrize("name", ["resnet50", "xlnet-large", "gnmt-4", "googlenet"])
def test_op_granularity_of_other_models_is_refused(name):
    with pytest.raises(PipeplanError) as err:
        zoo.build(name, {"granularity": "op"})
    msg = str(err.value)
    assert "\n" not in msg and repr(name) in msg and "'granularity'" in msg
    assert "must be one of layer, got 'op'" in msg and "bert-48" in msg


@pytest.mark.parametrize("value", ["block", "", "1", "ops", "layer,op"])
def test_bad_granularity_values(value):
    with pytest.raises(PipeplanError, match=r"^zoo model 'bert-48': option 'granularity' must "
                                            r"be one of layer, op, got "):
        zoo.build("bert-48", {"granularity": value})


def test_unknown_option_lists_granularity():
    with pytest.raises(PipeplanError, match=r"unknown option 'granular' \(known: granularity, "):
        zoo.build("t5-base", {"granular": "op"})


def test_too_many_ops_is_one_clear_line():
    with pytest.raises(PipeplanError, match=r"granularity=op gives 35,106 nodes; .* at most "
                                            r"20,000 \(use fewer layers or granularity=layer\)"):
        zoo.build("t5-11b", {"granularity": "op", "layers": "900"})
