"""Decoder-only LLM dimensions -> parameters, FLOPs and activation bytes (llm/spec.py), against
the published counts and the papers' closed forms."""

from __future__ import annotations

import pytest

from pipeplan.errors import PipeplanError
from pipeplan.llm.spec import PRESETS, DecoderSpec, gpt

#: Narayanan et al. 2021 (SC'21), Table 1: parameters (billions), heads, hidden, layers
MEGATRON_TABLE1 = [(1.7, 24, 2304, 24), (3.6, 32, 3072, 30), (7.5, 32, 4096, 36), (18.4, 48, 6144, 40),
                   (39.1, 64, 8192, 48), (76.1, 80, 10240, 60), (145.6, 96, 12288, 80),
                   (310.1, 128, 16384, 96), (529.6, 128, 20480, 105), (1008.0, 160, 25600, 128)]


def megatron_eq2(layers: int, h: int, v: int = 51200, s: int = 2048) -> float:
    """Narayanan et al. 2021, Eq. 2: P = 12lh^2 (1 + 13/12h + (V+s)/12lh)."""
    return 12 * layers * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))


def megatron_eq3(batch: int, layers: int, h: int, v: int = 51200, s: int = 2048) -> float:
    """Narayanan et al. 2021, Eq. 3: FLOPs of an iteration with activation recomputation."""
    return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))


@pytest.mark.parametrize("billions, heads, hidden, layers", MEGATRON_TABLE1)
def test_megatron_table1_parameter_counts(billions, heads, hidden, layers):
    spec = gpt("row", hidden, layers, heads)
    assert spec.total_params() / 1e9 == pytest.approx(billions, abs=0.05)
    # Eq. 2 leaves out the final LayerNorm's 2h
    assert spec.total_params() - 2 * hidden == pytest.approx(megatron_eq2(layers, hidden), rel=1e-12)


def test_gpt3_175b_parameters_and_training_compute():
    spec = PRESETS["gpt3-175b"]
    assert spec.total_params() / 1e9 == pytest.approx(174.6, abs=0.05)  # Narayanan et al. 2021, Table 2
    assert spec.total_params() == pytest.approx(175e9, rel=0.01)  # Brown et al. 2020, Table 2.1
    # Brown et al. 2020, Table D.1: 3.14e23 FLOPs for 300B tokens, counted as 6 x parameters per
    # token (attention scores left out)
    per_token = (spec.model_flops_per_sample() - 3 * spec.layers * spec.attention_core_flops(1)) / spec.seq
    assert per_token * 300e9 == pytest.approx(3.14e23, rel=0.01)


@pytest.mark.parametrize("batch, heads, hidden, layers", [(512, 24, 2304, 24), (1536, 96, 12288, 96),
                                                          (3072, 160, 25600, 128)])
def test_flops_with_recomputation_are_megatrons_eq3(batch, heads, hidden, layers):
    spec = gpt("row", hidden, layers, heads)
    ours = batch * (layers * spec.layer_training_flops(1, "full") + 3 * spec.head_flops(1))
    assert ours == pytest.approx(megatron_eq3(batch, layers, hidden), rel=1e-12)


@pytest.mark.parametrize("name, billions", [("llama3-8b", 8.0), ("llama3-70b", 70.0), ("llama3-405b", 405.0)])
def test_llama3_parameter_counts_are_the_published_sizes(name, billions):
    assert PRESETS[name].total_params() == pytest.approx(billions * 1e9, rel=0.01)


def test_llama3_dimensions_and_count():
    big = PRESETS["llama3-405b"]
    assert (big.layers, big.hidden, big.ffn, big.heads, big.kv_heads, big.vocab) == \
        (126, 16384, 53248, 128, 8, 128256)
    # grouped-query attention: keys and values are 8 heads of 128 wide
    spec = PRESETS["llama3-70b"]
    h, kv, f = 8192, 8 * 128, 28672
    assert spec.layer_params() == h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h
    assert spec.total_params() == 80 * spec.layer_params() + 2 * 128256 * h + h


def test_llama3_405b_training_compute():
    """Dubey et al. 2024 §3.2.1: 3.8e25 FLOPs for 15.6T tokens (6 x parameters per token)."""
    spec = PRESETS["llama3-405b"]
    per_token = (spec.model_flops_per_sample() - 3 * spec.layers * spec.attention_core_flops(1)) / spec.seq
    assert per_token * 15.6e12 == pytest.approx(3.8e25, rel=0.01)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("heads, hidden", [(96, 12288), (24, 2304)])
def test_activation_bytes_are_korthikantis(heads, hidden, t):
    """Korthikanti et al. 2022 §4: bytes per layer, s x b x h x (...) with 16-bit tensors."""
    spec = gpt("row", hidden, 4, heads)
    s, b, h, a = 2048, 2, hidden, heads
    sbh = s * b * h
    assert spec.layer_activation_bytes(b, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))  # Eq. 2
    assert spec.layer_activation_bytes(b, t, sp=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))  # Eq. 4
    assert spec.layer_activation_bytes(b, t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert spec.layer_activation_bytes(b, t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert spec.layer_activation_bytes(b, t, recompute="full") == pytest.approx(2 * sbh)
    if t == 1:
        assert spec.layer_activation_bytes(b) == pytest.approx(sbh * (34 + 5 * a * s / h))  # Eq. 1


def test_grouped_query_attention_and_gated_mlp_keep_what_they_compute_with():
    """Llama's layout: no dropout masks, fused attention (no s x s matrix), keys and values
    kv wide, three MLP tensors of ffn."""
    spec = PRESETS["llama3-70b"]
    s, b, h, kv, f, a = spec.seq, 1, 8192, 1024, 28672, 64
    tensors = {"two norms' inputs": 2 * 2 * s * b * h, "QKV and gate/up inputs": 2 * 2 * s * b * h,
               "Q": 2 * s * b * h, "K and V": 2 * 2 * s * b * kv, "output projection's input": 2 * s * b * h,
               "gate, up and their product": 3 * 2 * s * b * f, "log-sum-exp (fp32)": 4 * b * a * s}
    assert spec.layer_activation_bytes(b) == pytest.approx(sum(tensors.values()))
    # tensor parallelism divides all but the norms' and the first matrices' inputs
    assert spec.layer_activation_bytes(b, 8) == pytest.approx(8 * s * b * h + (sum(tensors.values()) - 8 * s * b * h) / 8)


@pytest.mark.parametrize("kwargs, words", [({"hidden": 100, "heads": 3}, "not a multiple of heads"),
                                           ({"kv_heads": 5}, "not a multiple of kv_heads"),
                                           ({"layers": 0}, "layers must be a positive integer"),
                                           ({"norm": "batchnorm"}, "norm must be")])
def test_bad_dimensions_are_refused(kwargs, words):
    base = dict(name="m", hidden=128, layers=2, heads=4, seq=16, vocab=100, ffn=512, kv_heads=4)
    with pytest.raises(PipeplanError, match=words):
        DecoderSpec(**{**base, **kwargs})


def test_unknown_recomputation_is_refused():
    with pytest.raises(PipeplanError, match="recompute must be one of none, selective, full"):
        PRESETS["llama3-8b"].layer_activation_bytes(1, recompute="some")


# -- zoo:gpt / zoo:llama3-* graphs ---------------------------------------------------------------
def test_zoo_llm_graphs_are_chains_of_embedding_layers_and_head():
    from pipeplan.graph import load_graph

    g = load_graph("zoo:llama3-70b?seq=4096&microbatch=2")
    spec = PRESETS["llama3-70b"]
    assert g.ids[0] == "embed" and g.ids[-1] == "head" and len(g) == spec.layers + 2
    assert g.params.sum() == pytest.approx(2 * spec.total_params())  # 16-bit weights
    assert g.meta["decoder"]["seq"] == 4096 and g.meta["microbatch"] == 2 and g.meta["precision"] == "bf16"
    assert g.flops[1] == pytest.approx(DecoderSpec(**{**spec.as_dict(), "seq": 4096}).layer_flops(2))
    small = load_graph("zoo:gpt?hidden=2304&layers=24&heads=24")
    assert small.meta["decoder"]["vocab"] == 51200 and small.tied == {"embedding": ["embed", "head"]}


@pytest.mark.parametrize("spec, words", [("zoo:gpt?hidden=128", "give layers, heads"),
                                         ("zoo:llama3-8b?hidden=3", "unknown option 'hidden'"),
                                         ("zoo:llama3-8b?seq=0", "'seq' must be an integer >= 1"),
                                         ("zoo:gpt?hidden=100&layers=2&heads=3", "not a multiple of heads")])
def test_bad_llm_zoo_options(spec, words):
    from pipeplan.graph import load_graph

    with pytest.raises(PipeplanError, match=words):
        load_graph(spec)


def test_mixed_precision_adam_holds_18_bytes_a_parameter():
    """Megatron-LM's distributed-optimizer guide: bf16 weights, fp32 gradients, fp32 master
    weights and Adam's two fp32 moments: 2 + 4 + 4 + 8 = 18 bytes a parameter."""
    from pipeplan.sim.formulas import state_bytes

    assert state_bytes(2.0, "adam", "bf16") == 18.0
    assert state_bytes(2.0, "sgd", "bf16") == 10.0
    assert state_bytes(4.0, "adam") == 16.0  # fp32 training: weights, gradients, two moments


def test_an_llm_graph_at_another_microbatch_is_rebuilt_not_scaled():
    from pipeplan.graph import load_graph
    from pipeplan.graph.scale import with_microbatch

    assert with_microbatch(load_graph("zoo:llama3-8b"), 4) == load_graph("zoo:llama3-8b?microbatch=4")
