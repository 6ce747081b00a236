"""Clusters: ``load_cluster(spec)`` takes a preset name, ``hier:...`` or a YAML/JSON file."""

from __future__ import annotations

from pathlib import Path

from ..errors import PipeplanError
from ..readers import load_json_or_yaml
from .build import cluster_from_dict, cluster_from_full_dict, cluster_to_dict, hierarchical
from .kinds import KINDS
from .model import Cluster, Device
from .presets import PRESETS, parse_hier, preset

__all__ = ["Cluster", "Device", "load_cluster", "hierarchical", "cluster_from_dict",
           "cluster_to_dict", "cluster_from_full_dict", "PRESETS", "KINDS"]


def load_cluster(spec: str) -> Cluster:
    if spec.startswith("hier:"):
        return parse_hier(spec)
    if spec in PRESETS or spec.startswith("mobile-hetero-"):
        return preset(spec)
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        if not path.exists():
            raise PipeplanError(f"cluster file {spec!r} not found")
        data = load_json_or_yaml(path, "cluster file")
        if isinstance(data, dict) and "bandwidth_matrix" in data:
            return cluster_from_full_dict(data, source=spec)
        return cluster_from_dict(data, source=spec)
    return preset(spec)  # raises with the list of presets
