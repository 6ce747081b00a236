"""Model specs for the runtime: ``example:NAME``, ``hf:ARCH?key=value&...`` (Hugging Face
``transformers`` from a config, ``hf.py``) or ``package.module:factory``.

A factory is a callable returning ``(module, example_input)``; the example input is one
microbatch (its first dimension is the microbatch size). Built-in examples are small
``nn.Sequential`` models that run on a CPU in seconds.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from types import ModuleType
from typing import Callable, Iterator

import torch
from torch import nn

from ..errors import PipeplanError
from ..limits import check_input_bytes


class TransformerBlock(nn.Module):
    """A pre-norm encoder layer (self-attention + MLP), batch-first."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def example_mlp(microbatch: int = 64) -> tuple[nn.Module, torch.Tensor]:
    width = 512
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(6):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers), torch.randn(microbatch, 256)


def example_transformer(microbatch: int = 8) -> tuple[nn.Module, torch.Tensor]:
    d, seq = 128, 64
    model = nn.Sequential(nn.Linear(32, d), *[TransformerBlock(d, 4, 4 * d) for _ in range(4)],
                          MeanPool(), nn.Linear(d, 10))
    return model, torch.randn(microbatch, seq, 32)


def example_cnn(microbatch: int = 16) -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, torch.randn(microbatch, 3, 32, 32)


class FlatResNet(nn.Module):
    """A small ResNet (He et al. 2016, basic blocks) written flat: every convolution,
    BatchNorm and ReLU is a submodule of its own and the residual additions happen in
    ``forward``, so a cut may fall inside a block and its skip connection cross stages."""

    def __init__(self, width: int = 32, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.blocks = blocks
        self.stem, self.stem_bn, self.stem_relu = nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        for i in range(blocks):
            for j in (1, 2):
                setattr(self, f"b{i}_conv{j}", nn.Conv2d(width, width, 3, padding=1, bias=False))
                setattr(self, f"b{i}_bn{j}", nn.BatchNorm2d(width))
                setattr(self, f"b{i}_relu{j}", nn.ReLU())
        self.pool, self.flat, self.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_relu(self.stem_bn(self.stem(x)))
        for i in range(self.blocks):
            h = getattr(self, f"b{i}_relu1")(getattr(self, f"b{i}_bn1")(getattr(self, f"b{i}_conv1")(x)))
            h = getattr(self, f"b{i}_bn2")(getattr(self, f"b{i}_conv2")(h))
            x = getattr(self, f"b{i}_relu2")(h + x)
        return self.fc(self.flat(self.pool(x)))


def example_resnet(microbatch: int = 16) -> tuple[nn.Module, torch.Tensor]:
    return FlatResNet(), torch.randn(microbatch, 3, 16, 16)


def example_tiny(microbatch: int = 4) -> tuple[nn.Module, torch.Tensor]:
    """Negligible compute: what a step costs beyond the layers (calibration of the runtime)."""
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)]), torch.randn(microbatch, 16)


EXAMPLES: dict[str, Callable[..., tuple[nn.Module, torch.Tensor]]] = {
    "mlp": example_mlp, "transformer": example_transformer, "cnn": example_cnn, "resnet": example_resnet,
    "tiny": example_tiny,
}


def failure_reason(e: BaseException) -> str:
    """One line on what user code raised; ``sys.exit`` named as such."""
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@contextmanager
def user_code(spec: str, doing: str) -> Iterator[None]:
    """Run the user's model code (import, factory, forward): whatever it raises, ``sys.exit``
    included, becomes one PipeplanError naming the model and what was being done."""
    try:
        yield
    except PipeplanError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 (a user's code: report, don't trace back)
        raise PipeplanError(f"model spec {spec!r}: {doing} failed ({failure_reason(e)})") from None


def _import(spec: str, mod_name: str) -> ModuleType:
    try:
        return importlib.import_module(mod_name)
    except ImportError as e:
        raise PipeplanError(f"model spec {spec!r}: cannot import {mod_name!r} ({e})") from None


def call_factory(spec: str, expected: str) -> tuple[nn.Module, torch.Tensor]:
    """``(module, example input)`` from a ``package.module:factory`` spec; ``expected`` says
    what a malformed spec should have been. Every failure is a one-line PipeplanError."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise PipeplanError(f"model spec {spec!r}: {expected}")
    with user_code(spec, f"importing {mod_name!r}"):  # its code raised, or is not Python
        module = _import(spec, mod_name)
    factory = getattr(module, attr, None)
    if factory is None:
        raise PipeplanError(f"model spec {spec!r}: {mod_name!r} has no {attr!r}")
    with user_code(spec, "the factory"):
        model, x = factory()
    if not isinstance(model, nn.Module) or not isinstance(x, torch.Tensor):
        raise PipeplanError(f"model spec {spec!r}: the factory must return (nn.Module, example input tensor)")
    if x.dim() == 0 or x.shape[0] < 1:
        raise PipeplanError(f"model spec {spec!r}: the example input must have a batch dimension of at least one "
                            f"sample (got shape {tuple(x.shape)})")
    return model, x


def input_signature(x: torch.Tensor) -> dict:
    """What a profile's times depend on in its input besides the microbatch size: one
    sample's shape and the dtype."""
    return {"sample_shape": list(x.shape[1:]), "dtype": str(x.dtype).removeprefix("torch.")}


def load_model(spec: str, microbatch: int | None = None, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """Build the model of ``spec`` with a fixed seed; resize the example input's batch
    dimension to ``microbatch`` when given."""
    torch.manual_seed(seed)
    if spec.startswith("hf:"):
        from .hf import hf_model

        model, x = hf_model(spec)
    elif spec.startswith("example:"):
        name = spec.split(":", 1)[1]
        if name not in EXAMPLES:
            raise PipeplanError(f"unknown example model {name!r} (known: {', '.join(EXAMPLES)})")
        model, x = EXAMPLES[name]()
    else:
        model, x = call_factory(spec, "expected example:NAME or package.module:factory")
    if microbatch is not None:
        if microbatch < 1:
            raise PipeplanError(f"--microbatch must be >= 1, got {microbatch}")
        check_input_bytes(microbatch * x[0].numel() * x.element_size(), f"model {spec!r} at --microbatch {microbatch}")
        reps = -(-microbatch // x.shape[0])
        x = x.repeat(reps, *([1] * (x.dim() - 1)))[:microbatch]
    return model, x
