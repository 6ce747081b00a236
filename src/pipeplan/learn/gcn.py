"""DRL-PP's graph encoder (§3.1): graph convolution layers of Eq. 1,

    GConv(X, A) = sigma( X Theta || D~^-1 A~ X Theta' ),

where A~ is the (symmetric) adjacency with self-loops, D~ its degree matrix, || is
concatenation and sigma a ReLU. A layer of ``units`` outputs gives each half
(``X Theta`` and the neighbourhood mean ``D~^-1 A~ X Theta'``) ``units / 2`` of them (the paper
gives the layer widths, 32/64/128, not the split).
"""

from __future__ import annotations

import torch
from torch import nn


def mean_adjacency(adjacency: torch.Tensor) -> torch.Tensor:
    """D~^-1 A~: the adjacency with self-loops, each row divided by its degree."""
    a = adjacency + torch.eye(adjacency.shape[-1], dtype=adjacency.dtype, device=adjacency.device)
    return a / a.sum(dim=-1, keepdim=True)


class GConv(nn.Module):
    """One layer of Eq. 1 (``units`` even)."""

    def __init__(self, inputs: int, units: int) -> None:
        super().__init__()
        if units % 2:
            raise ValueError(f"GConv units must be even, got {units}")
        self.self_weight = nn.Linear(inputs, units // 2, bias=False)  # Theta
        self.neighbour_weight = nn.Linear(inputs, units // 2, bias=False)  # Theta'

    def forward(self, x: torch.Tensor, mean_adj: torch.Tensor) -> torch.Tensor:
        """``x``: (nodes, inputs); ``mean_adj``: D~^-1 A~ (``mean_adjacency``)."""
        return torch.relu(torch.cat([self.self_weight(x), mean_adj @ self.neighbour_weight(x)], dim=-1))


class GraphEncoder(nn.Module):
    """Three GConv layers of 32, 64 and 128 units (§4.2): node representations H."""

    def __init__(self, features: int, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        sizes = (features, *widths)
        self.layers = nn.ModuleList(GConv(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        mean_adj = mean_adjacency(adjacency)
        for layer in self.layers:
            x = layer(x, mean_adj)
        return x
