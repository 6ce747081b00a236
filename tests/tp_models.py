"""Small models the tensor-parallel tests run in their workers (``tp_models:NAME``): a module
that imports little, so that each worker starts quickly."""

import torch
from torch import nn


def mlp() -> tuple[nn.Module, torch.Tensor]:
    """A two-layer MLP (``tp_models:mlp`` in the workers)."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), torch.randn(8, 16)


def convnet() -> tuple[nn.Module, torch.Tensor]:
    """Three convolutions and a classifier (``tp_models:convnet`` in the workers)."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(8, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    return net, torch.randn(8, 3, 6, 6)


class _GPT2Logits(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers import GPT2LMHeadModel

        self.lm = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def gpt2_logits() -> tuple[nn.Module, torch.Tensor]:
    """A Hugging Face GPT-2 (2 layers, n_embd 32) returning its logits, built with transformers'
    default attention (``tp_models:gpt2_logits`` in the workers)."""
    from transformers import GPT2Config

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return _GPT2Logits(config), torch.randint(0, 64, (4, 16))
