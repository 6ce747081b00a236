"""Simulator of one training iteration (SPP §III cost model): compile -> run -> memory,
bounds, steady state; ``batch`` evaluates many candidates at once."""

from .simulate import SimResult, predicted_s, simulate
from .timeline import Timeline

__all__ = ["simulate", "predicted_s", "SimResult", "Timeline"]
