"""Typed planner options: each planner declares a frozen dataclass of its ``-O KEY=VALUE``
settings; the text is parsed into those dataclasses here, once, at the edge (the CLI, or a
library caller), and planners read the typed object (``PlanOptions.settings_of``).

Fields are typed bool, int, float, str or Optional of one (``none``: unset, unless ``none`` is
one of the field's choices, as in ``recompute=none``, where it is that value), with ``metadata``:
``help``, ``choices``, numeric bounds (``min``/``max`` inclusive, ``above``/``below``
exclusive) and ``duration`` (a wall-clock budget: ``90s``, ``3m``, ``1h`` or bare seconds,
read as every ``--budget`` is). An unknown key or a value that does not parse is one
PipeplanError naming the planner, the key and what it takes.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Iterable, TypeVar

from ..errors import PipeplanError
from ..limits import MAX_BUDGET_S, MAX_SEED
from ..units import parse_duration

T = TypeVar("T")
Pairs = Iterable[tuple[str, str]]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: The range of a ``seed`` option (the ``--seed`` of train and dynamic takes the same).
SEED_RANGE = {"min": 0, "max": MAX_SEED}
_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclass(frozen=True)
class NoOptions:
    """The options of a planner that takes none."""


def _base_type(hint: Any) -> tuple[type, bool]:
    """(bool|int|float|str, optional) of a field's type hint."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
    if hint not in _EXPECTED:
        raise TypeError(f"planner option type {hint!r}: use bool, int, float, str or an Optional of one")
    return hint, optional


def _bounds_text(meta: Any) -> str:
    """A numeric option's range from its metadata: ``min``/``max`` (inclusive), ``above``/
    ``below`` (exclusive), e.g. '> 0' or '> 0 and < 1'."""
    parts = [f"{op} {meta[k] if isinstance(meta[k], int) else format(meta[k], 'g')}"
             for k, op in (("above", ">"), ("min", ">="), ("below", "<"), ("max", "<=")) if meta.get(k) is not None]
    return " and ".join(parts)


def _in_bounds(value: float, meta: Any) -> bool:
    checks = {"above": value > meta.get("above", -math.inf), "min": value >= meta.get("min", -math.inf),
              "below": value < meta.get("below", math.inf), "max": value <= meta.get("max", math.inf)}
    return all(checks[k] for k in checks if meta.get(k) is not None)


def _number(text: str, base: type, meta: Any, expected: str) -> float:
    """An int or float field's value; a ``duration`` field reads units (``5m``)."""
    if meta.get("duration"):
        try:
            return parse_duration(text, "")
        except PipeplanError:
            raise ValueError(f"a duration > 0 and <= {MAX_BUDGET_S / 86400:.0f} days (e.g. 90s, 3m, 1h; a bare number "
                             "is seconds)") from None
    try:
        value = base(text)
    except ValueError:
        raise ValueError(expected) from None
    if not math.isfinite(value) or not _in_bounds(value, meta):
        raise ValueError(expected)
    return value


def _parse_value(text: str, hint: Any, choices: tuple[str, ...] | None, meta: Any = None) -> Any:
    """``text`` as ``hint``; ValueError naming what was expected."""
    meta = meta or {}
    base, optional = _base_type(hint)
    bounds = _bounds_text(meta) if base in (int, float) else ""
    expected = f"one of {', '.join(choices)}" if choices else _EXPECTED[base] + (f" {bounds}" if bounds else "")
    if not text.strip():
        raise ValueError(f"{expected}, not an empty value")
    if optional and text.strip().lower() == "none" and "none" not in (choices or ()):
        return None  # unset; where ``none`` is one of the choices it is that value, not unset
    value: Any
    if base is bool:
        low = text.strip().lower()
        if low not in _TRUE + _FALSE:
            raise ValueError(expected)
        value = low in _TRUE
    elif base in (int, float):
        value = _number(text, base, meta, expected)
    else:
        value = text
    if choices and value not in choices:
        raise ValueError(expected)
    return value


def option_fields(cls: type) -> list[dict[str, Any]]:
    """Name, type, default, help (and choices) of each field of an options dataclass."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if f.default is MISSING:
            raise TypeError(f"planner option {f.name!r} of {cls.__name__}: needs a default")
        base, optional = _base_type(hints[f.name])
        row = {"name": f.name, "type": base.__name__ + (" | None" if optional else ""),
               "default": f.default, "help": f.metadata.get("help", "")}
        if f.metadata.get("choices"):
            row["choices"] = list(f.metadata["choices"])
        if base in (int, float) and _bounds_text(f.metadata):
            row["range"] = _bounds_text(f.metadata)
        out.append(row)
    return out


def parse_options(cls: type[T], pairs: Pairs, planner: str) -> T:
    """``pairs`` (``KEY=VALUE`` or ``PLANNER.KEY=VALUE``) as the frozen dataclass ``cls`` of
    planner ``planner``; a key given twice (either way) is refused, never silently the last."""
    known = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, text in pairs:
        target, dot, bare = key.rpartition(".")
        if dot and target != planner:
            raise PipeplanError(f"planner option {key!r} is for planner {target!r}, not {planner!r}")
        key = bare
        f = known.get(key)
        if f is None:
            what = f"its options: {', '.join(known)}" if known else "it takes none"
            raise PipeplanError(f"planner {planner!r} has no option {key!r} ({what})")
        if key in values:
            raise PipeplanError(f"planner {planner!r}: option {key!r} is given twice; give it once")
        try:
            values[key] = _parse_value(text, hints[key], f.metadata.get("choices"), f.metadata)
        except ValueError as e:
            raise PipeplanError(f"planner {planner!r}: option {key}={text!r}: expected {e}") from None
    return cls(**values)


def split_by_planner(declared: dict[str, set[str]], pairs: Pairs) -> dict[str, list[tuple[str, str]]]:
    """Each planner's pairs: an unprefixed ``KEY=VALUE`` goes to every planner that declares
    KEY (a PipeplanError if none does), ``NAME.KEY=VALUE`` to planner NAME only."""
    mine: dict[str, list[tuple[str, str]]] = {name: [] for name in declared}
    for key, value in pairs:
        target, dot, bare = key.rpartition(".")
        if dot:
            if target not in declared:
                raise PipeplanError(f"planner option {key!r}: {target!r} is not among the compared planners "
                                    f"({', '.join(declared)})")
            mine[target].append((bare, value))
            continue
        takers = [name for name, keys in declared.items() if key in keys]
        if not takers:
            known = "; ".join(f"{n}: {', '.join(sorted(k))}" for n, k in declared.items() if k) or "none"
            raise PipeplanError(f"planner option {key!r} is not an option of any compared planner "
                                f"(their options: {known})")
        for name in takers:
            mine[name].append((key, value))
    return mine


def option_pairs(settings: Any) -> list[tuple[str, str]]:
    """The fields of an options object that differ from their defaults, as ``KEY=VALUE``
    text that parses back to them (``pipeplan plan -O``)."""
    out = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value != f.default:
            out.append((f.name, "none" if value is None else str(value).lower() if isinstance(value, bool)
                        else repr(value) if isinstance(value, float) else str(value)))
    return out
