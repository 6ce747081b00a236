"""The measured model of benchmarks/schedules/gains.py: identical transformer blocks, so that
every schedule's stages (and chunks) hold equal work (``--model _blocks:blocks`` with
benchmarks/schedules on the path)."""

from __future__ import annotations

import torch
from torch import nn

from pipeplan.runtime.models import TransformerBlock

BLOCKS, D, SEQ = 8, 128, 64


def blocks(microbatch: int = 8) -> tuple[nn.Module, torch.Tensor]:
    """8 pre-norm encoder blocks (d=128, 4 heads, ffn 512) on (microbatch, 64, 128) inputs."""
    return nn.Sequential(*[TransformerBlock(D, 4, 4 * D) for _ in range(BLOCKS)]), torch.randn(microbatch, SEQ, D)
