"""Command-line value types shared by every subcommand's parser: each refuses a bad value
with argparse's one-line usage error, before any work."""

from __future__ import annotations

import argparse
import math
import os

from ..limits import MAX_CALIBRATION_S, MAX_SEED


#: The largest count any option takes (C's int: thread counts, torch sizes).
MAX_COUNT = 2**31 - 1


def _integer(text: str, low: int, high: int = MAX_COUNT) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
    if v > high:
        raise argparse.ArgumentTypeError(f"must be <= {high:,}, got {v}")
    return v


def positive_int(text: str) -> int:
    """An integer from 1 to ``MAX_COUNT``."""
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    """An integer from 0 to ``MAX_COUNT``."""
    return _integer(text, 0)


#: Threads per process, per core of this machine: more only slows a run down.
THREADS_PER_CORE = 4


def threads(text: str) -> int:
    """Threads: 1 to ``THREADS_PER_CORE`` x this machine's cores."""
    return _integer(text, 1, THREADS_PER_CORE * (os.cpu_count() or 1))


def names(text: str) -> list[str]:
    """A comma-separated list of names, each non-empty (``a,,b`` or ``a,`` is a typo, not a
    request for the default)."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty name in the comma-separated list {text!r}")
    return items


def seed(text: str) -> int:
    """A seed: an integer from 0 to ``limits.MAX_SEED`` (the -O seed= options' range too)."""
    return _integer(text, 0, MAX_SEED)


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (not nan, not inf)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def calibration_seconds(text: str) -> float:
    """One calibration measurement's length: seconds > 0, at most ``limits.MAX_CALIBRATION_S``."""
    v = positive_seconds(text)
    if v > MAX_CALIBRATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CALIBRATION_S:g} s, got {text!r}")
    return v
