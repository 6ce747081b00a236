"""Mixtures of experts and latent attention: parameter counts of the presets and of released
``config.json`` files read with transformers, against the counts their makers publish, and
one line where planning them is not possible yet."""

from __future__ import annotations

import json

import pytest

from pipeplan.graph.hf_config import from_hf
from pipeplan.llm.spec import PRESETS, decoder_of

#: (total, active a token) as published: Mixtral 8x7B "46.7B total, 12.9B active" and 8x22B
#: "141B, 39B active" (Mistral AI's announcements); Qwen3's model cards ("30.5B in total and
#: 3.3B activated", "235B / 22B"); DeepSeek-V3 "671B total, 37B activated" (its report, §1).
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "qwen3-30b-a3b": (30.5e9, 3.3e9),
             "qwen3-235b-a22b": (235e9, 22e9), "deepseek-v3": (671e9, 37e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_parameters_are_the_published_ones_within_one_percent(name):
    assert PRESETS[name].total_params() == pytest.approx(PUBLISHED[name][0], rel=0.01)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b"])
def test_active_parameters_are_the_published_ones_within_one_percent(name):
    """Every weight a token goes through, the token table and the LM head included."""
    assert PRESETS[name].active_params() == pytest.approx(PUBLISHED[name][1], rel=0.01)


def test_active_parameters_where_the_published_figure_is_rounded_another_way():
    """DeepSeek-V3's "37B" is its count without the token table (36.6B; with it 37.6B, 1.5%
    above); Qwen3-30B-A3B's "3.3B" is 3.35B cut to one decimal (its card's "29.9B
    non-embedding" total, without the table and the LM head, holds to 1%)."""
    ds, qwen = PRESETS["deepseek-v3"], PRESETS["qwen3-30b-a3b"]
    assert 36.5e9 <= ds.active_params(embedding=False) < 37.5e9 < ds.active_params()
    assert 3.3e9 <= qwen.active_params() < 3.4e9
    assert qwen.total_params() - qwen.embedding_params() - qwen.head_params() == pytest.approx(29.9e9, rel=0.01)


def test_deepseek_v3_counts_by_hand():
    """Latent attention and experts, counted from DeepSeek-V3's modeling code's projections:
    q 7168x1536 + norm 1536 + 1536x(128x192); kv 7168x(512+64) + norm 512 + 512x(128x256);
    out (128x128)x7168; a routed or shared expert 3x7168x2048; the router 7168x256; the three
    dense layers' MLP 3x7168x18432; two norms a layer; the table and the head 129280x7168."""
    attention = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    expert, norms = 3 * 7168 * 2048, 2 * 7168
    dense = attention + 3 * 7168 * 18432 + norms
    sparse = attention + 257 * expert + 7168 * 256 + norms
    table = 129280 * 7168
    assert PRESETS["deepseek-v3"].total_params() == 3 * dense + 58 * sparse + 2 * table + 7168
    active = attention + 9 * expert + 7168 * 256 + norms
    assert PRESETS["deepseek-v3"].active_params() == 3 * dense + 58 * active + 2 * table + 7168


def test_flops_per_token_of_gpt3_is_narayanan_et_als_equation_3():
    """72 B s l h^2 (1 + s/6h + V/12lh) for a batch of B sequences of s tokens (Narayanan et
    al. 2021, Eq. 3, no recomputation: 3/4 of theirs with it): per token, with 3 passes. Eq. 3
    leaves out the biases and norms (13h weights a layer, 1e-4 of the whole)."""
    spec = PRESETS["gpt3-175b"]
    s, l, h, v = spec.seq, spec.layers, spec.hidden, spec.vocab
    eq3 = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert spec.flops_per_token() == pytest.approx(eq3 + 6 * 13 * h * l, rel=1e-12)


#: released config.json files (the keys that set dimensions, and some that no transformers
#: version reads, as the released files carry them)
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "rope_theta": 1e6, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "max_position_embeddings": 32768, "router_aux_loss_coef": 0.02}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "vocab_size": 129280,
               "rms_norm_eps": 1e-6, "rope_theta": 10000, "tie_word_embeddings": False,
               "max_position_embeddings": 163840, "ep_size": 1, "num_nextn_predict_layers": 1,
               "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc"}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "vocab_size": 151936, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
             "max_position_embeddings": 40960}


@pytest.mark.parametrize("config, preset", [(MIXTRAL, "mixtral-8x7b"), (DEEPSEEK_V3, "deepseek-v3"),
                                            (QWEN3_MOE, "qwen3-30b-a3b")])
def test_a_released_config_is_read_as_a_graph_holding_the_published_parameters(config, preset, tmp_path):
    """The graph of a released config: its nodes' parameters are the model's total (every
    expert of every mixture layer, the dense first layers as dense), the published count."""
    folder = tmp_path / preset
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    graph = from_hf(f"hf:{folder}?seq=4096")
    published = {"mixtral-8x7b": 46.7e9, "deepseek-v3": 671e9, "qwen3-30b-a3b": 30.5e9}[preset]
    assert float(graph.params.sum()) / 2 == pytest.approx(published, rel=0.01)
    assert float(graph.params.sum()) / 2 == PRESETS[preset].total_params()


def test_the_reader_builds_the_presets_dimensions():
    """The hf: reader's spec equals the preset field by field (name and sequence aside)."""
    from dataclasses import asdict

    from pipeplan.graph import hf_config

    for config, preset in ((MIXTRAL, "mixtral-8x7b"), (DEEPSEEK_V3, "deepseek-v3"), (QWEN3_MOE, "qwen3-30b-a3b")):
        import transformers

        cfg = transformers.AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items()
                                                                         if k != "model_type"})
        ours = asdict(hf_config._decoder(f"hf:{preset}", cfg, 4096))
        theirs = asdict(PRESETS[preset])
        assert {k: v for k, v in ours.items() if k != "name"} == {k: v for k, v in theirs.items() if k != "name"}


def test_a_mixtures_dimensions_round_trip_through_a_graphs_meta():
    assert decoder_of({"decoder": PRESETS["mixtral-8x7b"].as_dict()}) == PRESETS["mixtral-8x7b"]
