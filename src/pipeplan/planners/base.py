"""What every planner takes, the registry that names them, and ``run_planner``.

A planner is ``plan(graph, cluster, options) -> Plan``; the caller simulates the plan for its
prediction (``evaluate``), so every planner is judged by the same simulator. A planner's own
settings (``-O KEY=VALUE``) are a frozen dataclass given at registration; ``planner_settings``
parses the text into them once (``planners.options``), and the planner reads its typed object
with ``PlanOptions.settings_of``.
"""

from __future__ import annotations

import time
from importlib import import_module
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Callable, TypeVar

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..plan import Plan, is_decoder
from ..sim import SimResult, simulate
from ..sim.engine import warm_up
from ..limits import check_microbatches
from ..units import fmt_bytes
from .options import NoOptions, Pairs, option_fields, parse_options, split_by_planner
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
    #: the planners' own typed options (``-O``), one dataclass object per planner, parsed once
    #: (``planner_settings``); a planner whose class is absent runs with its defaults
    settings: tuple[Any, ...] = ()
    #: plans other planners already made on these inputs, by planner name (``compare`` gives
    #: them to a planner registered ``after_others``, which may start from them)
    known_plans: dict[str, tuple[Plan, SimResult]] | None = field(default=None, compare=False, hash=False,
                                                                   repr=False)

    def settings_of(self, cls: type[T]) -> T:
        """This planner's typed options: the ``cls`` object among ``settings``, else its
        defaults (another planner's options never reach this one)."""
        return next((s for s in self.settings if type(s) is cls), None) or cls()


Estimate = Callable[[Graph, Cluster, PlanOptions], float]


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
    own_batch: bool = False  # on decoder LLMs it picks the microbatch size itself (``register``)
    searches: bool = True  # it evaluates many plans: the simulator's kernels are loaded before its timer

    def describe(self) -> dict[str, Any]:
        """What ``pipeplan planners`` lists."""
        return {"name": self.name, "description": self.description, "default_schedule": self.default_schedule,
                "options": option_fields(self.options)}


REGISTRY: dict[str, PlannerInfo] = {}


def register(name: str, description: str, default_schedule: str, options: type | None = None,
             memory_variants: bool = True, estimate: Estimate | None = None, in_best: bool = True,
             after_others: bool = False, own_batch: bool = False, searches: bool = True):
    """Register ``fn(graph, cluster, PlanOptions) -> Plan`` under ``name``; ``options``: the
    frozen dataclass of its ``-O`` options (None: it takes none); ``estimate``: how many
    seconds it may take on an instance, for progress bars (None: well under a second);
    ``in_best``: False for planners run only when named (a yardstick, a learning agent);
    ``after_others``: it starts from other planners' plans, so ``compare`` runs it last and
    hands it theirs (``PlanOptions.known_plans``) instead of having it plan them again;
    ``own_batch``: on decoder LLM graphs it chooses the microbatch size for ``--global-batch``
    and keeps memory within bounds itself (no split loop, no ``fit_memory`` rework);
    ``searches``: False for a planner that simulates a handful of plans, which the simulator
    then runs without loading its compiled kernels (``sim.engine``)."""
    if options is not None and not is_dataclass(options):
        raise TypeError(f"planner {name!r}: options must be a dataclass, got {options!r}")
    cls = options or NoOptions
    option_fields(cls)  # a field of an unsupported type fails at import, not at the user

    def deco(fn: Callable[[Graph, Cluster, PlanOptions], Plan]):
        REGISTRY[name] = PlannerInfo(name, description, default_schedule, fn, cls, memory_variants, estimate,
                                     in_best, after_others, own_batch, searches)
        return fn
    return deco


#: Each planner's module (under ``pipeplan.planners``), imported when the planner is first
#: asked for, so that one planner's command loads only what that planner needs
#: (``tests/test_planners_options.py`` checks the table against what the modules register).
MODULES = {"dp": "simple", "gpipe": "simple", "pipedream": "pipedream", "hetpipe": "hetpipe", "spp": "spp",
           "exact": "exact", "resalloc": "resalloc", "drl-pp": "drlpp", "automap": "automap",
           "automap-infer": "automap", "megatron": "megatron", "joint": "joint", "random": "search",
           "anneal": "search"}


def load_all() -> dict[str, PlannerInfo]:
    """Every planner registered (their modules imported): the registry."""
    for module in sorted(set(MODULES.values())):
        import_module(f"{__package__}.{module}")
    return REGISTRY


def get_planner(name: str) -> PlannerInfo:
    if name not in REGISTRY and name in MODULES:
        import_module(f"{__package__}.{MODULES[name]}")
    info = REGISTRY.get(name)
    if info is None:
        raise PipeplanError(f"unknown planner {name!r} (known: {', '.join(sorted(load_all()))})")
    return info


def planner_catalog() -> list[dict[str, Any]]:
    """Every planner: name, description, default schedule, options (``pipeplan planners``)."""
    return [info.describe() for _, info in sorted(load_all().items())]


def planner_settings(planners: list[str], pairs: Pairs) -> tuple[Any, ...]:
    """The ``-O`` text of a run of ``planners`` parsed, once, into each one's options
    dataclass (``PlanOptions.settings``): one planner takes ``KEY=VALUE`` and
    ``NAME.KEY=VALUE`` for its own name; several (``compare``) give an unprefixed key to every
    planner that declares it. An unknown key or planner, or a value that does not parse, is a
    PipeplanError before any work."""
    infos = [get_planner(n) for n in planners]
    if len(infos) == 1:
        return (parse_options(infos[0].options, pairs, infos[0].name),)
    mine = split_by_planner({i.name: {f["name"] for f in option_fields(i.options)} for i in infos}, pairs)
    return tuple(parse_options(i.options, mine[i.name], i.name) for i in infos)


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
    setup_s = warm_up() if info.searches else 0.0  # the simulator's kernels compiled or loaded: set-up
    t0 = time.perf_counter()
    own_batch = info.own_batch and is_decoder(graph)
    if options.global_batch is not None and not own_batch:
        plan = keep_tied_together(plan_for_global_batch(info.fn, graph, cluster, options, options.global_batch,
                                                        memory_variants=info.memory_variants))
        plan.planner, plan.setup_s = name, setup_s
        _check_schedule(name, plan, options)
        return plan, evaluate(plan)
    plan = keep_tied_together(info.fn(graph, cluster, options))  # no plan cuts a tied parameter
    plan.search_s = time.perf_counter() - t0
    plan.planner = name
    result = evaluate(plan)
    reworkable = info.memory_variants and not own_batch
    if result.over_memory and reworkable and not options.allow_over_memory:
        fitted = fit_memory(plan)  # its fastest variant that fits (planning time too)
        if fitted is not plan and (options.schedule is None or fitted.schedule == options.schedule):
            fitted.search_s, fitted.planner = time.perf_counter() - t0, name
            plan, result = fitted, evaluate(fitted)
    plan.setup_s = setup_s
    _check_schedule(name, plan, options)
    return plan, result


def _check_schedule(name: str, plan: Plan, options: PlanOptions) -> None:
    """``--schedule`` is honored or refused, never silently another (the safety net behind
    each planner's own handling of it)."""
    if options.schedule is not None and plan.schedule != options.schedule:
        raise PipeplanError(f"planner {name!r} does not plan for --schedule {options.schedule} here (its plan runs "
                            f"{plan.schedule}); drop --schedule, or pick a planner that takes it")


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
