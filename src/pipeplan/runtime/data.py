"""The training every run and its check share: a fixed random global batch, which samples
each pipeline takes, and the loss (mean squared error written as a sum over the global
element count, so that microbatches and replicas add up to the one-process gradient)."""

from __future__ import annotations

import torch
from torch import nn

from .translate import microbatches_of


def global_batch(model: nn.Module, x: torch.Tensor, m_count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """M microbatches of random inputs shaped like ``x`` (integers below its largest when it
    holds indices) and random targets shaped like the model's output (probed in eval mode, so
    no buffer changes)."""
    gen = torch.Generator().manual_seed(seed + 1)
    z = x.shape[0]
    if x.is_floating_point():
        xs = torch.randn((m_count * z, *x.shape[1:]), generator=gen)
    else:  # token ids and other indices: drawn from the range the example uses
        xs = torch.randint(0, int(x.max()) + 1, (m_count * z, *x.shape[1:]), generator=gen, dtype=x.dtype)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out_shape = model(xs[:1]).shape[1:]
    model.train(was_training)
    ys = torch.randn((m_count * z, *out_shape), generator=gen)
    return xs, ys


def equal_replication(plan) -> bool:
    """Every stage on the same number of devices: k pipelines of S stages."""
    return len({len(s.devices) for s in plan.stages}) == 1


def split_rows(z: int, k: int) -> list[tuple[int, int]]:
    """k parts of z samples as even as whole samples allow (the first z mod k one larger), as
    (start, end) row ranges."""
    bounds = [0]
    for p in range(k):
        bounds.append(bounds[-1] + z // k + (p < z % k))
    return list(zip(bounds[:-1], bounds[1:]))


def share_size(z: int, p: int, k: int, replicas: str) -> int:
    """Samples of each microbatch that pipeline p runs: all of them, or its split part."""
    a, b = split_rows(z, k)[p] if replicas == "split" else (0, z)
    return b - a


def share(m: int, z: int, p: int, k: int, replicas: str) -> torch.Tensor:
    """Indices of the samples of microbatch m that pipeline p runs."""
    a, b = split_rows(z, k)[p] if replicas == "split" else (0, z)
    return torch.arange(m * z + a, m * z + b)


def pipeline_samples(m_count: int, z: int, p: int, k: int, replicas: str) -> torch.Tensor:
    """Indices of the global batch's samples that pipeline p processes, microbatch by microbatch."""
    return torch.cat([share(m, z, p, k, replicas) for m in microbatches_of(p, k, m_count, replicas)])


def squared_error(out: torch.Tensor, target: torch.Tensor, denom: float) -> torch.Tensor:
    return ((out - target) ** 2).sum() / denom
