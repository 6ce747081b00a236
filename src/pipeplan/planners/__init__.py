"""Planners, registered by name: ``get_planner(name).fn(graph, cluster, options) -> Plan``."""

from . import exact, hetpipe, pipedream, resalloc, simple, spp
from .base import REGISTRY, PlanOptions, evaluate, get_planner, run_planner

ALL = (simple, pipedream, hetpipe, spp, exact, resalloc)

__all__ = ["REGISTRY", "PlanOptions", "get_planner", "run_planner", "evaluate"]
