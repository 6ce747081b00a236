"""Simulator of one training iteration (SPP §III cost model): compile -> run -> memory,
bounds, steady state; ``batch`` evaluates many candidates at once."""

from .simulate import SimResult, simulate
from .timeline import Timeline

__all__ = ["simulate", "SimResult", "Timeline"]
