"""Human units <-> SI. Inside the code: seconds, bytes, bytes per second.

Accepted spellings (case-sensitive for the b/B distinction):
  bytes:      ``123B``, ``32GiB``, ``16GB``, ``512MiB``, ``1.5TB`` (KB/MB/GB/TB decimal, KiB.. binary)
  bandwidth:  ``128Gbps``, ``50Gb/s``, ``10GB/s``, ``900MB/s``, ``1e9B/s``
  time:       ``5ms``, ``2us``, ``3ns``, ``1.5s``
  duration:   ``90s``, ``3m``, ``1h`` (budgets; ``m`` is minutes; a bare number is seconds)
Text needs its unit (``intra=128`` is refused, not read as 128 bytes/s), except ``0`` and a
budget's seconds; a
number in a JSON or YAML file (not a string) is in the base unit: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import math
import re

from .errors import PipeplanError
from .limits import MAX_BUDGET_S

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_BYTES_RE = re.compile(rf"^{_NUM}\s*(|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)(B?)$")
_BW_RE = re.compile(rf"^{_NUM}\s*(|k|K|M|G|T|Ki|Mi|Gi|Ti)(bps|b/s|Bps|B/s)$")
_TIME_RE = re.compile(rf"^{_NUM}\s*(s|ms|us|µs|ns|min|h)$")
_TIME_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


def _finite_nonneg(value: float, text: object, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise PipeplanError(f"{what} must be a finite non-negative number, got {text!r}")
    return value


def _number(text: object, what: str, example: str) -> float | None:
    """A file's number (in the base unit), None for a string to read with its unit; a string
    that is a bare number other than 0 is refused: its unit would be a guess."""
    if isinstance(text, bool):
        raise PipeplanError(f"{what}: expected a number or a string with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        return _finite_nonneg(float(text) if abs(text) < 2**1024 else math.inf, text, what)
    if not isinstance(text, str):
        raise PipeplanError(f"{what}: expected a number or a string with a unit, got {text!r}")
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if value != 0:
        raise PipeplanError(f"{what}: {text!r} has no unit; write it with one (e.g. {example})")
    return 0.0


def parse_bytes(text: object, what: str = "size") -> float:
    """``'32GiB'`` -> 34359738368.0 bytes."""
    n = _number(text, what, "32GiB, 16GB, 1024B")
    if n is not None:
        return n
    m = _BYTES_RE.match(str(text).strip())
    if not m or (m.group(2) and not m.group(3)):
        raise PipeplanError(f"{what}: cannot read {text!r} as a size (e.g. 32GiB, 16GB, 1024B)")
    return _finite_nonneg(float(m.group(1)) * _PREFIX[m.group(2)], text, what)


def parse_bandwidth(text: object, what: str = "bandwidth") -> float:
    """``'128Gbps'`` -> 16e9 bytes/s; ``'10GB/s'`` -> 10e9 bytes/s."""
    n = _number(text, what, "128Gbps, 10GB/s")
    if n is not None:
        return n
    m = _BW_RE.match(str(text).strip())
    if not m:
        raise PipeplanError(f"{what}: cannot read {text!r} as a bandwidth (e.g. 128Gbps, 10GB/s)")
    prefix = m.group(2).upper() if m.group(2) in ("k",) else m.group(2)
    value = float(m.group(1)) * _PREFIX[prefix]
    if m.group(3) in ("bps", "b/s"):
        value /= 8.0
    return _finite_nonneg(value, text, what)


def parse_time(text: object, what: str = "time") -> float:
    """``'5ms'`` -> 0.005 seconds."""
    n = _number(text, what, "5ms, 2us, 1.5s")
    if n is not None:
        return n
    m = _TIME_RE.match(str(text).strip())
    if not m:
        raise PipeplanError(f"{what}: cannot read {text!r} as a time (e.g. 5ms, 2us, 0.1)")
    return _finite_nonneg(float(m.group(1)) * _TIME_SCALE[m.group(2)], text, what)


_DURATION_RE = re.compile(rf"^{_NUM}\s*(|s|m|min|h)$")


def parse_duration(text: object, what: str = "budget") -> float:
    """A budget: ``'90s'``, ``'3m'`` (minutes), ``'1h'``, ``'2.5'`` (seconds) -> seconds (> 0)."""
    m = _DURATION_RE.match(str(text).strip())
    if not m:
        raise PipeplanError(f"{what}: cannot read {text!r} as a duration (e.g. 90s, 3m, 1h)")
    value = float(m.group(1)) * {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    if not (math.isfinite(value) and value > 0):
        raise PipeplanError(f"{what} must be positive, got {text!r}")
    if value > MAX_BUDGET_S:
        raise PipeplanError(f"{what} {text!r} is longer than {MAX_BUDGET_S / 86400:.0f} days")
    return value


def fmt_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_bytes_up(n: float) -> str:
    """``n`` bytes rounded up to two decimals in ``fmt_bytes``'s unit, as a value to type
    (``'42.39MiB'``): reading it back gives at least ``n``."""
    unit = fmt_bytes(n).split()[1]
    if unit == "B":
        return f"{math.ceil(n)}B"
    scale = 2.0 ** (10 * ("KiB", "MiB", "GiB", "TiB").index(unit) + 10)
    return f"{math.ceil(n / scale * 100) / 100:.2f}{unit}"


def fmt_bandwidth(bps: float) -> str:
    bits = bps * 8
    for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bps"


def time_unit(values) -> tuple[str, float]:
    """One unit for a column of times (the largest decides): (name, factor from seconds)."""
    top = max((v for v in values if v == v and v != float("inf")), default=0.0)
    return ("s", 1.0) if top >= 1 else ("ms", 1e3) if top >= 1e-3 else ("us", 1e6)


def fmt_time_in(s: float, unit: tuple[str, float]) -> str:
    return f"{s * unit[1]:.3f} {unit[0]}"


def fmt_time(s: float) -> str:
    if s >= 1 or s == 0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"
