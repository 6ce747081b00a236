"""Model graphs and their loaders: ``load_graph(spec)`` takes a PipeDream ``graph.txt`` (file
or folder), a native ``.json`` graph, ``zoo:NAME[?key=value&...]`` or a Hugging Face decoder
config, ``hf:ARCH?key=value&...`` or ``hf:PATH`` (``graph/hf_config.py``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import PipeplanError
from ..readers import parse_query
from .linearize import Linearization, chains, is_chain, linearize
from .model import Graph, NodeSpec
from .native import graph_from_dict, graph_to_dict, load_native, save_graph
from .pipedream import load_pipedream, parse_pipedream

__all__ = ["Graph", "NodeSpec", "Linearization", "load_graph", "linearize", "is_chain", "chains",
           "graph_to_dict", "graph_from_dict", "save_graph", "parse_pipedream"]


def parse_zoo_spec(spec: str) -> tuple[str, dict[str, str]]:
    body = spec[len("zoo:"):]
    name, _, query = body.partition("?")
    return name.strip(), parse_query(query, f"model {spec!r}")


def load_graph(spec: str) -> Graph:
    """Load a model graph from a spec string (see the module docstring)."""
    if spec.startswith("hf:"):
        from .hf_config import from_hf

        return from_hf(spec)
    if spec.startswith("zoo:"):
        from . import llm, zoo

        name, options = parse_zoo_spec(spec)
        if name in llm.DESCRIPTIONS:
            return llm.from_zoo(name, options)
        return zoo.build(name, options)
    path = Path(spec)
    if path.is_dir():
        for candidate in ("graph.json", "graph.txt"):
            if (path / candidate).is_file():
                path = path / candidate
                break
        else:
            raise PipeplanError(f"model folder {spec!r} has no graph.txt or graph.json")
    if not path.exists():
        raise PipeplanError(f"model {spec!r}: no such file (expected a graph.txt, a .json graph or zoo:NAME)")
    return load_native(path) if path.suffix == ".json" else load_pipedream(path)  # readers: one-line errors
