"""Simulator of one training iteration (SPP §III cost model)."""

from .simulate import SimResult, simulate
from .timeline import Timeline

__all__ = ["simulate", "SimResult", "Timeline"]
