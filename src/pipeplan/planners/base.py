"""What every planner takes, the registry that names them, and ``run_planner``.

A planner is ``plan(graph, cluster, options) -> Plan``; the caller simulates the plan for its
prediction (``evaluate``), so every planner is judged by the same simulator. A planner's own
settings (``-O KEY=VALUE``) are a frozen dataclass given at registration; ``planner_options``
parses ``PlanOptions.extra`` into it, so an unknown key or a bad value is one clear error.
"""

from __future__ import annotations

import math
import time
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Callable, TypeVar

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..plan import Plan
from ..sim import SimResult, simulate
from ..sim.engine import warm_up
from ..limits import MAX_SEED, check_microbatches
from ..units import fmt_bytes
from .tied import keep_tied_together
from .variants import fit_memory, plan_for_global_batch

T = TypeVar("T")


@dataclass(frozen=True)
class PlanOptions:
    microbatches: int = 32
    schedule: str | None = None  # None: the planner's own default
    optimizer: str = "adam"
    seed: int = 0
    #: what-if runs: planners ignore memory when they choose, and no fitting variant is
    #: looked for (the plan is still flagged when it overflows)
    allow_over_memory: bool = False
    global_batch: int | None = None  # samples per iteration: the planner layer picks microbatch size and M
    extra: tuple[tuple[str, str], ...] = ()  # planner-specific KEY=VALUE options (-O), see planner_options
    #: plans other planners already made on these inputs, by planner name (``compare`` gives
    #: them to a planner registered ``after_others``, which may start from them)
    known_plans: dict[str, tuple[Plan, SimResult]] | None = field(default=None, compare=False, hash=False,
                                                                   repr=False)


# -- typed planner options -------------------------------------------------------------------

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: The range of a ``seed`` option (the ``--seed`` of train and dynamic takes the same).
SEED_RANGE = {"min": 0, "max": MAX_SEED}
_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


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


def _parse_value(text: str, hint: Any, choices: tuple[str, ...] | None, meta: Any = None) -> Any:
    """``text`` as ``hint``; ValueError naming what was expected."""
    meta = meta or {}
    base, optional = _base_type(hint)
    bounds = _bounds_text(meta) if base in (int, float) else ""
    expected = f"one of {', '.join(choices)}" if choices else _EXPECTED[base] + (f" {bounds}" if bounds else "")
    if not text.strip():
        raise ValueError(f"{expected}, not an empty value")
    if optional and text.strip().lower() == "none":
        return None
    value: Any
    if base is bool:
        low = text.strip().lower()
        if low not in _TRUE + _FALSE:
            raise ValueError(expected)
        value = low in _TRUE
    elif base in (int, float):
        try:
            value = base(text)
        except ValueError:
            raise ValueError(expected) from None
        if not math.isfinite(value) or not _in_bounds(value, meta):
            raise ValueError(expected)
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


def planner_options(cls: type[T], options: PlanOptions, planner: str) -> T:
    """``options.extra`` (``-O KEY=VALUE`` or ``-O PLANNER.KEY=VALUE`` pairs; the last of a
    key wins) as the frozen
    dataclass ``cls``: fields typed bool, int, float, str or Optional of one (``none``),
    ``metadata={"help": ..., "choices": (...)}``. An unknown key or a value that does not
    parse is a PipeplanError naming the planner, the key and what it takes."""
    known = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, text in options.extra:
        target, dot, bare = key.rpartition(".")
        if dot and target != planner:
            raise PipeplanError(f"planner option {key!r} is for planner {target!r}, not {planner!r}")
        key = bare
        f = known.get(key)
        if f is None:
            what = f"its options: {', '.join(known)}" if known else "it takes none"
            raise PipeplanError(f"planner {planner!r} has no option {key!r} ({what})")
        try:
            values[key] = _parse_value(text, hints[key], f.metadata.get("choices"), f.metadata)
        except ValueError as e:
            raise PipeplanError(f"planner {planner!r}: option {key}={text!r}: expected {e}") from None
    return cls(**values)


Estimate = Callable[[Graph, Cluster, PlanOptions], float]


@dataclass(frozen=True)
class NoOptions:
    """The options of a planner that takes none."""


# -- the registry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannerInfo:
    name: str
    description: str
    default_schedule: str
    fn: Callable[[Graph, Cluster, PlanOptions], Plan]
    options: type = NoOptions  # the frozen dataclass its -O options parse into
    memory_variants: bool = True  # False: the plan is kept as its program returns it, flagged
    estimate: Estimate | None = None  # seconds it may take on an instance (None: well under one)
    in_best: bool = True  # run by ``best`` and a compare without --planners
    after_others: bool = False  # compare runs it last, with the others' plans as ``known_plans``

    def parse_options(self, options: PlanOptions) -> Any:
        return planner_options(self.options, options, self.name)

    def describe(self) -> dict[str, Any]:
        """What ``pipeplan planners`` lists."""
        return {"name": self.name, "description": self.description, "default_schedule": self.default_schedule,
                "options": option_fields(self.options)}


REGISTRY: dict[str, PlannerInfo] = {}


def register(name: str, description: str, default_schedule: str, options: type | None = None,
             memory_variants: bool = True, estimate: Estimate | None = None, in_best: bool = True,
             after_others: bool = False):
    """Register ``fn(graph, cluster, PlanOptions) -> Plan`` under ``name``; ``options``: the
    frozen dataclass of its ``-O`` options (None: it takes none); ``estimate``: how many
    seconds it may take on an instance, for progress bars (None: well under a second);
    ``in_best``: False for planners run only when named (a yardstick, a learning agent);
    ``after_others``: it starts from other planners' plans, so ``compare`` runs it last and
    hands it theirs (``PlanOptions.known_plans``) instead of having it plan them again."""
    if options is not None and not is_dataclass(options):
        raise TypeError(f"planner {name!r}: options must be a dataclass, got {options!r}")
    cls = options or NoOptions
    option_fields(cls)  # a field of an unsupported type fails at import, not at the user

    def deco(fn: Callable[[Graph, Cluster, PlanOptions], Plan]):
        REGISTRY[name] = PlannerInfo(name, description, default_schedule, fn, cls, memory_variants, estimate,
                                     in_best, after_others)
        return fn
    return deco


def get_planner(name: str) -> PlannerInfo:
    from . import ALL  # noqa: F401  (imports every planner module so that it registers)

    info = REGISTRY.get(name)
    if info is None:
        raise PipeplanError(f"unknown planner {name!r} (known: {', '.join(sorted(REGISTRY))})")
    return info


def planner_catalog() -> list[dict[str, Any]]:
    """Every planner: name, description, default schedule, options (``pipeplan planners``)."""
    get_planner("dp")  # loads the registry
    return [REGISTRY[n].describe() for n in sorted(REGISTRY)]


# -- running a planner -----------------------------------------------------------------------

def run_planner(name: str, graph: Graph, cluster: Cluster, options: PlanOptions) -> tuple[Plan, SimResult]:
    """Plan, time the search, simulate, and store the prediction in the plan. Every planner
    answers: a plan that overflows a device is replaced by its fastest variant that fits
    (``variants.fit_memory``), or kept and flagged (``result.over_memory``) when none does.
    With ``options.global_batch`` the microbatch size and count are chosen too (every split
    the planner is run on counts as search time). One-time set-up, compiling or loading the
    simulator's kernels, happens before the timer starts and is recorded as ``plan.setup_s``."""
    if options.microbatches < 1:
        raise PipeplanError(f"--microbatches must be >= 1, got {options.microbatches}")
    check_microbatches(options.microbatches, "--microbatches")
    info = get_planner(name)
    info.parse_options(options)  # bad -O options are a user error before any work
    setup_s = warm_up()  # the simulator's kernels compiled or loaded: set-up, not search
    t0 = time.perf_counter()
    if options.global_batch is not None:
        plan = keep_tied_together(plan_for_global_batch(info.fn, graph, cluster, options, options.global_batch,
                                                        memory_variants=info.memory_variants))
        plan.planner, plan.setup_s = name, setup_s
        return plan, evaluate(plan)
    plan = keep_tied_together(info.fn(graph, cluster, options))  # no plan cuts a tied parameter
    plan.search_s = time.perf_counter() - t0
    plan.planner = name
    result = evaluate(plan)
    if result.over_memory and info.memory_variants and not options.allow_over_memory:
        fitted = fit_memory(plan)  # its fastest variant that fits (planning time too)
        if fitted is not plan:
            fitted.search_s, fitted.planner = time.perf_counter() - t0, name
            plan, result = fitted, evaluate(fitted)
    plan.setup_s = setup_s
    return plan, result


def memory_over_bytes(result: SimResult) -> dict[str, float]:
    """Each device over its memory: by how many bytes."""
    return {d: float(m - lim) for d, m, lim in zip(result.devices, result.memory_bytes, result.memory_limit)
            if m > lim}


def overflow_text(result: SimResult) -> str:
    """Which device overflows most, by how much (or that every device fits)."""
    if not result.over_memory:
        return "fits in memory"
    over = result.memory_bytes - result.memory_limit
    i = int(np.argmax(over))
    return (f"{result.devices[i]} (stage {result.stage_of_device[i]}) needs {fmt_bytes(result.memory_bytes[i])} "
            f"of its {fmt_bytes(result.memory_limit[i])} (over by {fmt_bytes(over[i])})")


def fits(plan: Plan) -> bool:
    return not simulate(plan, timeline=False).over_memory


def evaluate(plan: Plan) -> SimResult:
    result = simulate(plan)
    plan.prediction = result.summary()
    return result
