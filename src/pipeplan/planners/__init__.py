"""Planners, registered by name: ``get_planner(name).fn(graph, cluster, options) -> Plan``;
``run_planner`` plans and simulates; ``compare`` / ``best`` run several on the same inputs."""

from . import automap, drlpp, exact, hetpipe, joint, megatron, pipedream, resalloc, simple, spp
from .base import REGISTRY, PlanOptions, evaluate, get_planner, planner_catalog, planner_settings, run_planner
from .compare import CompareRow, best, compare, default_planners

ALL = (simple, pipedream, hetpipe, spp, exact, resalloc, drlpp, automap, megatron, joint)

__all__ = ["REGISTRY", "PlanOptions", "get_planner", "run_planner", "evaluate", "planner_settings",
           "planner_catalog", "CompareRow", "compare", "best", "default_planners"]
