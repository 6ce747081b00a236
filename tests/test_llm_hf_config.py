"""Decoder graphs from Hugging Face configs (graph/hf_config.py), read by transformers'
AutoConfig without weights or downloads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph

pytest.importorskip("transformers")

LLAMA3_8B = ("hf:llama?hidden_size=4096&num_hidden_layers=32&num_attention_heads=32&num_key_value_heads=8"
             "&intermediate_size=14336&vocab_size=128256&seq=8192&rope_theta=500000&rms_norm_eps=0.00001")


def test_a_llama_config_is_the_llama3_preset():
    ours, preset = load_graph(LLAMA3_8B), load_graph("zoo:llama3-8b")
    assert np.array_equal(ours.params, preset.params) and np.allclose(ours.fwd, preset.fwd)
    assert ours.meta["decoder"] == {**preset.meta["decoder"], "name": "llama"}


def test_gpt2_small_has_its_published_parameter_count():
    """GPT-2 small: 124,439,808 parameters (tied embedding, 1,024 learned positions)."""
    g = load_graph("hf:gpt2?n_embd=768&n_layer=12&n_head=12&vocab_size=50257")
    assert g.params.sum() / 2 == 124_439_808 and g.meta["decoder"]["seq"] == 1024


@pytest.mark.parametrize("spec, words", [
    ("hf:gpt2", "does not give n_embd, n_layer, n_head, vocab_size"),
    ("hf:llama?hidden_size=1024", "does not give num_hidden_layers, num_attention_heads, intermediate_size, vocab_size"),
    ("hf:llama?bogus_key=3&" + LLAMA3_8B[len("hf:llama?"):], "'llama' configs have no key 'bogus_key'"),
    (LLAMA3_8B.replace("num_hidden_layers=32", "num_hidden_layers=1000000000"), "layers 1,000,000,000 is above"),
    (LLAMA3_8B.replace("seq=8192", "seq=1000000000"), "seq 1,000,000,000 is above"),
])
def test_a_config_short_of_dimensions_or_with_a_key_it_lacks_is_one_line(spec, words):
    """Never transformers' default dimensions in silence, never a key passed through unread,
    never minutes on an absurd size (the limits are checked before the graph is built)."""
    with pytest.raises(PipeplanError, match=re.escape(words)):
        load_graph(spec)


def test_a_config_file_short_of_dimensions_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 512}')
    with pytest.raises(PipeplanError, match="does not give num_hidden_layers, num_attention_heads"):
        load_graph(f"hf:{tmp_path}")


def test_qwen2_counts_its_query_key_value_biases():
    base = "hf:qwen2?hidden_size=512&num_hidden_layers=2&num_attention_heads=8&num_key_value_heads=2" \
           "&intermediate_size=1024&vocab_size=1000&tie_word_embeddings=true&seq=128"
    qwen, llama = load_graph(base), load_graph(base.replace("hf:qwen2", "hf:llama"))
    assert qwen.params[1] - llama.params[1] == 2 * (512 + 2 * 128)  # bf16 bytes of q, k and v biases
    assert qwen.tied == {"embedding": ["embed", "head"]}


def test_a_config_file_or_its_folder(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("mistral", hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=512, vocab_size=500).save_pretrained(tmp_path)
    for spec in (f"hf:{tmp_path}", f"hf:{tmp_path / 'config.json'}?seq=64"):
        g = load_graph(spec)
        assert len(g) == 3 + 2 and g.meta["decoder"]["kv_heads"] == 2
    assert load_graph(f"hf:{tmp_path}?seq=64&microbatch=2").meta["microbatch"] == 2


@pytest.mark.parametrize("spec, words", [("hf:mixtral", r"does not give hidden_size, .*num_local_experts, num_experts_per_tok"),
                                         ("hf:bert", "'bert' configs are not planned"),
                                         ("hf:nosucharch", "transformers cannot build this config"),
                                         ("hf:llama?seq=0", "seq must be an integer >= 1"),
                                         ("hf:/no/such/config.json", "no such file"), ("hf:/tmp/x.json", "expected a config.json"),
                                         ("hf:llama?hidden_size=100&num_attention_heads=3", "transformers cannot build this config")])
def test_bad_hf_configs_are_one_line(spec, words):
    with pytest.raises(PipeplanError, match=words) as e:
        load_graph(spec)
    assert "\n" not in str(e.value)


def test_a_fifo_as_config_is_refused_before_reading(tmp_path):
    import os

    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(PipeplanError, match="is a FIFO, not a regular file"):
        load_graph(f"hf:{tmp_path}")
