"""The models Auto-MAP shards (sharding/models.py): published sizes, scalar loss,
torch.export of the training graph, errors."""

import pytest
import torch

from pipeplan.errors import PipeplanError
from pipeplan.sharding.models import SHARD_MODELS, VGG19, build, load_shard_model

TINY = ("t5-tiny", "bert-tiny", "gpt2-tiny", "vgg19-tiny")

#: published parameter counts (T5: Raffel et al. 2020 with the shared embedding; VGG-19 with
#: 1000 classes: Simonyan & Zisserman 2015; BERT-base: Devlin et al. 2019; GPT-2 small: Radford
#: et al. 2019, 124 M with the tied embedding)
PUBLISHED = {"t5-base": 223e6, "t5-3b": 2.85e9, "t5-11b": 11.3e9, "vgg19": 143.7e6, "bert": 110e6, "gpt2": 124e6}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_ones(name):
    model = build(name, meta=True)
    assert model.param_count() == pytest.approx(PUBLISHED[name], rel=0.02)
    assert all(p.is_meta for p in model.module.parameters())


@pytest.mark.slow
def test_every_name_builds_and_its_loss_is_a_scalar():
    for name in SHARD_MODELS:
        meta = name not in TINY
        model = build(name, batch=2, seq=8, meta=meta)
        assert model.name == name and len(model.inputs) == len(model.input_names)
        if meta and name.startswith("t5-") and name != "t5-base":
            continue  # the same code as t5-base, only larger
        loss = model.module(*model.inputs)
        assert loss.shape == () and loss.dtype == torch.float32
        if not meta:
            assert torch.isfinite(loss) and loss.requires_grad


def test_names_are_the_papers_and_hugging_faces():
    vgg = dict(build("vgg19", meta=True).module.named_parameters())
    convs = [n for n in vgg if "_conv" in n and n.endswith(".weight")]
    assert len(convs) == 16 and convs[0] == "block1_conv1.weight" and convs[-1] == "block5_conv4.weight"
    assert vgg["fc1.weight"].shape == (4096, 25088) and vgg["predictions.weight"].shape == (1000, 4096)
    t5 = build("t5-base", meta=True).module
    names = dict(t5.named_parameters())
    assert "shared.weight" in names and "encoder.block.11.layer.1.DenseReluDense.wi.weight" in names
    assert "lm_head.weight" not in names and t5.lm_head.weight is t5.shared.weight  # tied, one parameter
    assert build("t5-tiny").input_names == ("input_ids", "decoder_input_ids", "labels")
    assert build("vgg19-tiny").input_names == ("features", "labels")


def test_the_same_seed_gives_the_same_model_and_inputs():
    a, b, c = build("vgg19-tiny", seed=1), build("vgg19-tiny", seed=1), build("vgg19-tiny", seed=2)
    assert torch.equal(a.module.fc1.weight, b.module.fc1.weight) and torch.equal(a.inputs[0], b.inputs[0])
    assert not torch.equal(a.module.fc1.weight, c.module.fc1.weight)


def test_batch_and_seq_size_the_inputs():
    model = build("t5-tiny", batch=3, seq=5)
    assert [tuple(x.shape) for x in model.inputs] == [(3, 5)] * 3
    assert tuple(build("vgg19", batch=2, meta=True).inputs[0].shape) == (2, 3, 224, 224)


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_export_gives_the_training_graph(name):
    model = build(name, batch=2, seq=8)
    ep = torch.export.export(model.module, model.inputs).run_decompositions()
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert users == list(model.input_names)
    lifted = {s.target for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"}
    aliases = model.aliases()
    assert lifted == set(aliases) and set(aliases.values()) == {n for n, _ in model.module.named_parameters()}
    assert torch.allclose(ep.module()(*model.inputs), model.module(*model.inputs), rtol=1e-5)


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_export_of_a_meta_model():
    # T5-tiny: the same code as t5-base (test_names_are_the_papers_and_hugging_faces), a sixth of
    # its layers to trace; meta, its embedding tied to the LM head
    model = build("t5-tiny", batch=2, seq=8, meta=True)
    assert all(p.is_meta for p in model.module.parameters())
    ep = torch.export.export(model.module, model.inputs)
    lifted = [s.target for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"]
    assert sorted(lifted) == sorted(model.aliases())
    assert model.aliases()["lm_head.weight"] == "shared.weight"


def test_a_user_factory_gets_a_squared_loss_and_keeps_its_names():
    model = load_shard_model("pipeplan.runtime.models:example_tiny")
    assert model.input_names == ("input",) and "0.weight" in dict(model.module.named_parameters())
    out = torch.nn.Sequential(*model.module)(model.inputs[0])
    assert torch.allclose(model.module(*model.inputs), out.pow(2).mean())


@pytest.mark.parametrize("spec, words", [
    ("t5-12b", "unknown shard model 't5-12b'"),
    ("nosuchpackage.mod:f", "cannot import"),
    ("pipeplan.runtime.models:nothing", "has no 'nothing'"),
    (":f", "expected a built-in name"),
])
def test_bad_specs_are_one_line_errors(spec, words):
    with pytest.raises(PipeplanError, match=words) as e:
        load_shard_model(spec)
    assert "\n" not in str(e.value)


def test_bad_sizes_are_errors():
    with pytest.raises(PipeplanError, match="positive"):
        build("t5-tiny", batch=0)
    with pytest.raises(PipeplanError, match="positions"):
        build("bert-tiny", seq=1000)
    with pytest.raises(PipeplanError, match="multiple of 32"):
        VGG19(image=100)
