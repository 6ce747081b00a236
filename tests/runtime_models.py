"""Model factories for the runtime tests (``--model runtime_models:FACTORY``)."""

from __future__ import annotations

import torch
from torch import nn


def bn_cnn() -> tuple[nn.Module, torch.Tensor]:
    """conv + BatchNorm + ReLU(inplace=True), as torchvision writes them: a stage cut after a
    BatchNorm starts with an in-place layer."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return model, torch.randn(8, 3, 8, 8)


def dropout_mlp() -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
    return model, torch.randn(8, 16)


class _RankSkew(nn.Module):
    """Adds the worker's rank to its input: a model that trains differently when distributed,
    which --check must catch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        return x + (dist.get_rank() if dist.is_initialized() else 0)


def rank_skewed() -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), _RankSkew(), nn.Linear(32, 4))
    return model, torch.randn(8, 16)


class Residual(nn.Module):
    """Not a Sequential: a skip connection around two layers and a functional add."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.inp(x))
        y = self.b(torch.relu(self.a(h)))
        return self.out(y + h)


def residual() -> tuple[nn.Module, torch.Tensor]:
    return Residual(), torch.randn(8, 16)
