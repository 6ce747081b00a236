"""``hf:llama?...`` in the runtime: transformers' own Llama laid out as the analytic graph's
layers (``embed``, ``layer0`` ..., ``head``). Its output is checked against
``LlamaForCausalLM``'s own forward with eager attention and transformers' causal mask (an
implementation the wrapper does not use), with the same weights."""

from __future__ import annotations

import pytest
import torch

from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph
from pipeplan.runtime.models import load_model

SPEC = ("hf:llama?hidden_size=64&num_hidden_layers=3&num_attention_heads=4&num_key_value_heads=2"
        "&intermediate_size=96&vocab_size=300&seq=12&microbatch=2")


def _reference(model: torch.nn.Module):
    """A ``LlamaForCausalLM`` of the same config with ``model``'s weights, eager attention."""
    import transformers

    cfg = model.layer0.layer.self_attn.config
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg.to_dict(), "attn_implementation": "eager"}))
    names = {"embed.weight": "model.embed_tokens.weight", "head.norm.weight": "model.norm.weight",
             "head.lm_head.weight": "lm_head.weight"}
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("layer"):
            index, rest = key.split(".", 1)
            state[f"model.layers.{index[len('layer'):]}.{rest.removeprefix('layer.')}"] = value
        else:
            state[names[key]] = value
    ref.load_state_dict(state, strict=True)
    return ref.eval()


def test_the_layers_are_the_analytic_graphs_nodes():
    model, x = load_model(SPEC)
    graph = load_graph(SPEC)
    assert [n for n, _ in model.named_children()] == graph.ids
    assert tuple(x.shape) == (2, 12) and graph.meta["microbatch"] == 2 and graph.meta["seq"] == 12


def test_the_stacked_layers_compute_transformers_causal_lm():
    model, x = load_model(SPEC)
    ref = _reference(model)
    with torch.no_grad():
        ours, theirs = model(x), ref(input_ids=x).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)
        changed = x.clone()
        changed[:, -1] = (changed[:, -1] + 1) % 300  # a later token does not reach earlier positions
        assert torch.equal(model(changed)[:, :-1], ours[:, :-1])


def test_defaults_are_the_analytic_graphs():
    """Unset keys take LlamaConfig's defaults, as in the graph: a 7B model, refused as too big
    to build here, in one line."""
    with pytest.raises(PipeplanError, match="parameters"):
        load_model("hf:llama")


@pytest.mark.parametrize("query, words", [("num_key_value_heads=3", "num_key_value_heads must be a positive"),
                                          ("hidden_size=66", "not a multiple"),
                                          ("seq=5000&max_position_embeddings=64", "beyond")])
def test_bad_llama_settings_are_one_line(query, words):
    from urllib.parse import parse_qsl

    base, _, settings = SPEC.partition("?")
    merged = {**dict(parse_qsl(settings)), **dict(parse_qsl(query))}  # a key given twice is refused itself
    with pytest.raises(PipeplanError, match=words):
        load_model(base + "?" + "&".join(f"{k}={v}" for k, v in merged.items()))
