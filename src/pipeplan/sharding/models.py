"""The models Auto-MAP partitions (paper §5, Tables 3-6), built for operator partitioning
(§3.2, §4.2) and auto data parallelism (§3.3, §4.3): each one's ``module`` takes the
model's input tensors and RETURNS THE SCALAR TRAINING LOSS, so ``torch.export`` of it is
the whole training graph's forward part and its trainable parameters are the variables
a plan replicates or partitions.

- ``t5-base``, ``t5-3b``, ``t5-11b``: Hugging Face ``T5ForConditionalGeneration`` from a
  ``T5Config`` with the published sizes (Raffel et al. 2020; tied input/output embedding,
  as the released checkpoints), dropout 0, cross-entropy on ``labels``; ``t5-tiny`` for
  tests and CPU runs. Inputs ``(input_ids, decoder_input_ids, labels)``.
- ``bert``, ``bert-tiny``: ``BertForMaskedLM`` (bert-base sizes), dropout 0, masked-LM
  cross-entropy on ``labels``. Inputs ``(input_ids, labels)``.
- ``gpt2``, ``gpt2-tiny``: ``GPT2LMHeadModel`` (GPT-2 small sizes; tiny: 2 layers, n_embd 64),
  dropout 0, language-model cross-entropy of the inputs shifted by one. GPT-2's attention
  projection ``c_attn`` is one fused ``Conv1D`` (q | k | v in one weight), which the rules do not
  cut (a cut by heads is a strided one across the three blocks). Input ``(input_ids,)``.
- ``vgg19``, ``vgg19-tiny``: VGG-19 (Simonyan & Zisserman 2015, configuration E) written here
  with Keras' layer names, the ones of the paper's Table 4: ``block1_conv1`` ... ``block5_conv4``,
  ``fc1``, ``fc2``, ``predictions``. Keras' dense kernel is (in, out) and PyTorch's Linear
  weight (out, in): the paper's ``fc1/kernel=1`` is ``fc1.weight`` dimension 0 here.
  Inputs ``(features, labels)``.

Parameter names are the module's ``named_parameters`` names (the HF models' own names, e.g.
``shared.weight``, ``encoder.block.0.layer.0.SelfAttention.q.weight``); a tied parameter's
other names map to it by ``ShardModel.aliases``. The HF models use the eager attention
(matmul, softmax, matmul): explicit operations in the exported graph, and DTensor has no
sharding strategy for CPU's fused scaled-dot-product attention; a user's model built by
transformers with another attention is switched to the eager one (``eager_attention``). ``meta=True``
builds shapes only (``torch.device("meta")``): t5-11b's 11.3 B parameters cost no memory.
Weights are random (seeded); nothing is ever downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import PipeplanError
from ..runtime.models import call_factory


@dataclass
class ShardModel:
    """A model to shard: ``module(*inputs)`` is the scalar training loss."""

    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]

    def param_count(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def aliases(self) -> dict[str, str]:
        """Every name a parameter is registered under -> its ``named_parameters`` name. Tied
        parameters have several (T5: ``lm_head.weight``, ``encoder.embed_tokens.weight`` ->
        ``shared.weight``); ``torch.export`` lifts each alias as a placeholder of its own and
        routes every use through one of them (the last), so an IR maps them back with this."""
        first: dict[int, str] = {id(p): n for n, p in self.module.named_parameters()}
        return {n: first[id(p)] for n, p in self.module.named_parameters(remove_duplicate=False)}


# ----------------------------------------------------------------------------- T5

_T5_SIZES: dict[str, dict] = {
    "t5-tiny": dict(d_model=64, d_ff=128, d_kv=32, num_heads=2, num_layers=2, num_decoder_layers=2,
                    vocab_size=256),
    "t5-base": dict(d_model=768, d_ff=3072, d_kv=64, num_heads=12, num_layers=12, num_decoder_layers=12,
                    vocab_size=32128),
    "t5-3b": dict(d_model=1024, d_ff=16384, d_kv=128, num_heads=32, num_layers=24, num_decoder_layers=24,
                  vocab_size=32128),
    "t5-11b": dict(d_model=1024, d_ff=65536, d_kv=128, num_heads=128, num_layers=24, num_decoder_layers=24,
                   vocab_size=32128),
}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise PipeplanError("the T5 and BERT models need Hugging Face transformers "
                            "(pip install 'pipeplan[hf]')") from None
    return transformers


def _t5_class() -> type:
    tf = _transformers()

    class T5Loss(tf.T5ForConditionalGeneration):
        """T5 whose forward is the training loss (cross-entropy of the labels)."""

        def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                    labels: torch.Tensor) -> torch.Tensor:
            return super().forward(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                                   labels=labels, use_cache=False).loss

    return T5Loss


def build_t5(name: str, batch: int, seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]:
    tf = _transformers()
    cfg = tf.T5Config(**_T5_SIZES[name], dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=True,
                      use_cache=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                      attn_implementation="eager")
    module = _t5_class()(cfg)
    vocab = cfg.vocab_size
    input_ids = torch.randint(2, vocab, (batch, seq))
    labels = torch.randint(2, vocab, (batch, seq))
    decoder_input_ids = torch.cat([torch.zeros(batch, 1, dtype=labels.dtype), labels[:, :-1]], dim=1)
    return module, (input_ids, decoder_input_ids, labels), ("input_ids", "decoder_input_ids", "labels")


# ----------------------------------------------------------------------------- BERT

_BERT_SIZES: dict[str, dict] = {
    "bert-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      vocab_size=256, max_position_embeddings=128),
    "bert": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=30522, max_position_embeddings=512),
}


def _bert_class() -> type:
    tf = _transformers()

    class BertLoss(tf.BertForMaskedLM):
        """BERT whose forward is the masked-LM loss (cross-entropy of the labels)."""

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return super().forward(input_ids=input_ids, labels=labels).loss

    return BertLoss


def build_bert(name: str, batch: int, seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]:
    tf = _transformers()
    sizes = _BERT_SIZES[name]
    if seq > sizes["max_position_embeddings"]:
        raise PipeplanError(f"model {name!r}: seq {seq} is over its {sizes['max_position_embeddings']} positions")
    cfg = tf.BertConfig(**sizes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        tie_word_embeddings=True, attn_implementation="eager")
    module = _bert_class()(cfg)
    input_ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    labels = torch.randint(0, cfg.vocab_size, (batch, seq))
    return module, (input_ids, labels), ("input_ids", "labels")


# ----------------------------------------------------------------------------- GPT-2

_GPT2_SIZES: dict[str, dict] = {
    "gpt2-tiny": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128),
    "gpt2": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
}


def _gpt2_class() -> type:
    tf = _transformers()

    class GPT2Loss(tf.GPT2LMHeadModel):
        """GPT-2 whose forward is the language-model loss of its input (next-token cross-entropy)."""

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            # an explicit mask: without one transformers looks for packed sequences, reading values
            mask = torch.ones_like(input_ids)
            return super().forward(input_ids=input_ids, attention_mask=mask, labels=input_ids, use_cache=False).loss

    return GPT2Loss


def build_gpt2(name: str, batch: int, seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]:
    tf = _transformers()
    sizes = _GPT2_SIZES[name]
    if seq > sizes["n_positions"]:
        raise PipeplanError(f"model {name!r}: seq {seq} is over its {sizes['n_positions']} positions")
    last = sizes["vocab_size"] - 1  # GPT-2's end-of-text token, the vocabulary's last
    cfg = tf.GPT2Config(**sizes, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                        use_cache=False, bos_token_id=last, eos_token_id=last, attn_implementation="eager")
    module = _gpt2_class()(cfg)
    return module, (torch.randint(0, cfg.vocab_size, (batch, seq)),), ("input_ids",)


def eager_attention(module: nn.Module) -> None:
    """Switch a transformers model inside ``module`` to the eager attention (matmul, softmax,
    matmul), which DTensor can shard; other modules are left as they are."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if getattr(config, "_attn_implementation", "eager") != "eager":
            config._attn_implementation = "eager"


# ----------------------------------------------------------------------------- VGG-19

#: configuration E: output channels of each block's 3x3 convolutions (each block ends in a max-pool)
VGG19_BLOCKS = ((64, 64), (128, 128), (256, 256, 256, 256), (512, 512, 512, 512), (512, 512, 512, 512))


class VGG19(nn.Module):
    """VGG-19 (configuration E): 16 3x3 convolutions with ReLU in 5 blocks each closed by a
    2x2 max-pool, then fc1, fc2 (ReLU) and predictions; names as Keras' ``VGG19``.
    ``width`` scales the channels (1.0: the published 64..512), ``hidden`` is fc1/fc2's width."""

    def __init__(self, classes: int = 1000, image: int = 224, width: float = 1.0, hidden: int = 4096) -> None:
        super().__init__()
        if image % 32:
            raise PipeplanError(f"vgg19: the image size must be a multiple of 32 (5 max-pools), got {image}")
        self.convs: list[str] = []
        self.pool_after: set[str] = set()  # the last convolution of each block
        cin = 3
        for b, block in enumerate(VGG19_BLOCKS, 1):
            for c, cout in enumerate(block, 1):
                cout = max(1, int(cout * width))
                name = f"block{b}_conv{c}"
                setattr(self, name, nn.Conv2d(cin, cout, 3, padding=1))
                self.convs.append(name)
                cin = cout
            self.pool_after.add(self.convs[-1])
        self.fc1 = nn.Linear(cin * (image // 32) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.predictions = nn.Linear(hidden, classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.convs:
            x = torch.relu(getattr(self, name)(x))
            if name in self.pool_after:
                x = nn.functional.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.predictions(x)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(features), labels)


def build_vgg19(name: str, batch: int, seq: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]:
    if name == "vgg19":
        module, image, classes = VGG19(), 224, 1000
    else:
        module, image, classes = VGG19(classes=10, image=32, width=0.125, hidden=64), 32, 10
    features = torch.randn(batch, 3, image, image)
    labels = torch.randint(0, classes, (batch,))
    return module, (features, labels), ("features", "labels")


# ----------------------------------------------------------------------------- registry

_Builder = Callable[[str, int, int], tuple[nn.Module, tuple[torch.Tensor, ...], tuple[str, ...]]]

#: name -> (builder, a one-line description)
SHARD_MODELS: dict[str, tuple[_Builder, str]] = {
    "t5-tiny": (build_t5, "T5, d_model 64, 2+2 layers, vocab 256 (tests, CPU runs)"),
    "t5-base": (build_t5, "T5-base, 223 M parameters"),
    "t5-3b": (build_t5, "T5-3B, 2.85 B parameters"),
    "t5-11b": (build_t5, "T5-11B, 11.3 B parameters"),
    "bert-tiny": (build_bert, "BERT (masked LM), hidden 64, 2 layers, vocab 256"),
    "bert": (build_bert, "BERT-base (masked LM), 110 M parameters"),
    "gpt2-tiny": (build_gpt2, "GPT-2 (language model), n_embd 64, 2 layers, 4 heads, vocab 256"),
    "gpt2": (build_gpt2, "GPT-2 small (language model), 124 M parameters"),
    "vgg19-tiny": (build_vgg19, "VGG-19 at 1/8 width, 32x32 images, fc 64, 10 classes"),
    "vgg19": (build_vgg19, "VGG-19, 224x224 images, 1000 classes, 143.7 M parameters"),
}


def build(name: str, batch: int = 8, seq: int = 32, meta: bool = False, seed: int = 0) -> ShardModel:
    """Build the built-in model ``name`` with random weights from ``seed``; ``batch`` and
    ``seq`` size the example inputs (``seq`` is unused by VGG-19). ``meta=True``: parameters
    and inputs on the meta device (shapes only)."""
    if name not in SHARD_MODELS:
        raise PipeplanError(f"unknown shard model {name!r} (known: {', '.join(SHARD_MODELS)}, "
                            "or package.module:factory)")
    if batch < 1 or seq < 1:
        raise PipeplanError(f"model {name!r}: batch and seq must be positive, got batch={batch} seq={seq}")
    builder = SHARD_MODELS[name][0]
    torch.manual_seed(seed)
    if meta:
        with torch.device("meta"):
            module, inputs, names = builder(name, batch, seq)
    else:
        module, inputs, names = builder(name, batch, seq)
    module.train()
    return ShardModel(name, module, inputs, names)


def _with_squared_loss(module: nn.Module) -> nn.Module:
    """``module`` whose forward returns the mean of squares of its output; its class is
    swapped for a subclass so that its parameter names stay the user's own."""
    cls = type(module)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (the input's name)
        out = cls.forward(self, input)
        return out.to(torch.promote_types(out.dtype, torch.float32)).pow(2).mean()

    module.__class__ = type(f"{cls.__name__}SquaredLoss", (cls,), {"forward": forward})
    return module


def _user_model(spec: str, meta: bool, seed: int) -> ShardModel:
    expected = f"expected a built-in name ({', '.join(SHARD_MODELS)}) or package.module:factory"
    torch.manual_seed(seed)
    if meta:
        with torch.device("meta"):
            module, x = call_factory(spec, expected)
    else:
        module, x = call_factory(spec, expected)
    module.train()
    eager_attention(module)
    return ShardModel(spec, _with_squared_loss(module), (x,), ("input",))


def load_shard_model(spec: str, batch: int = 8, seq: int = 32, meta: bool = False, seed: int = 0) -> ShardModel:
    """A built-in name (``SHARD_MODELS``) or ``package.module:factory`` (a callable returning
    ``(module, example_input)``; its loss is the mean of squares of the output, its one input
    is named ``input`` and keeps the factory's batch size)."""
    if ":" in spec:
        return _user_model(spec, meta, seed)
    return build(spec, batch=batch, seq=seq, meta=meta, seed=seed)
