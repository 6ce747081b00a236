"""Command-line value types shared by every subcommand's parser: each refuses a bad value
with argparse's one-line usage error, before any work."""

from __future__ import annotations

import argparse

from .errors import PipeplanError
from .limits import check_seed


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    v = _integer(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def seed(text: str) -> int:
    """A seed: an integer from 0 to ``limits.MAX_SEED``."""
    try:
        return check_seed(_integer(text), "--seed")
    except PipeplanError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--seed: ")) from None
