"""A plan's measured seconds per iteration, as a callable that measuring scorers take
(``learn.env.RuntimeScorer``: DRL-PP §3.4 scores plans "in a real-world environment")."""

from __future__ import annotations

from typing import Callable

from ..plan import Plan


def plan_runner(model_spec: str, steps: int = 3, warmup: int = 1, threads: int = 1,
                timeout_s: float | None = 300.0) -> Callable[[Plan], float]:
    """``runner(plan)``: train ``model_spec`` with ``plan`` on one worker process per device
    (``pipeplan run``), ``steps`` timed iterations after ``warmup``; its measured seconds per
    iteration. Failures are PipeplanErrors."""
    def run(plan: Plan) -> float:
        from .executor import RunConfig, run_plan  # lazy: torch.distributed, processes

        cfg = RunConfig(spec=model_spec, steps=steps, warmup=warmup, threads=threads, timeout_s=timeout_s)
        return float(run_plan(plan, cfg).measured_s)
    return run
