"""Planners, registered by name: ``get_planner(name).fn(graph, cluster, options) -> Plan``;
``run_planner`` plans and simulates; ``compare`` / ``best`` run several on the same inputs.
A planner's module is imported when the planner is first asked for (``base.MODULES``)."""

from .base import REGISTRY, PlanOptions, evaluate, get_planner, planner_catalog, planner_settings, run_planner
from .compare import CompareRow, best, compare, default_planners

__all__ = ["REGISTRY", "PlanOptions", "get_planner", "run_planner", "evaluate", "planner_settings",
           "planner_catalog", "CompareRow", "compare", "best", "default_planners"]
