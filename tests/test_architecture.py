"""The package's imports follow the data flow of ../shared/DESIGN.md (graph + cluster ->
planner -> plan -> schedule IR -> simulator or runtime): each room imports only the rooms
below it, and no module-level import cycle exists. Walked from the source, not from what
happens to be imported at test time."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: what every room may use
BASE = {"units", "errors", "limits", "readers", "budget", "outputs"}
#: each room and the rooms it may import (besides itself and BASE)
ALLOWED = {
    "graph": {"llm"},
    "cluster": set(),
    "llm": {"cluster"},
    "plan": {"graph", "cluster", "llm"},
    "schedule": set(),
    "sim": {"plan", "schedule", "graph", "cluster", "llm"},
    "learn": {"sim", "plan", "schedule", "graph", "cluster"},
    "planners": {"learn", "sim", "plan", "schedule", "graph", "cluster", "llm"},
    "engines": {"sim", "plan", "schedule", "graph", "cluster", "llm"},
    "runtime": {"plan", "schedule", "graph", "cluster"},
    "sharding": {"learn", "sim", "runtime", "graph", "cluster"},
    "dynamic": {"learn"},
    "viz": {"schedule"},
    "cli": {"graph", "cluster", "plan", "schedule", "sim", "learn", "planners", "runtime", "sharding", "dynamic",
            "viz", "engines", "llm", "pipeplan"},
    "__main__": {"cli"},
    "pipeplan": set(),
    **{b: set() for b in BASE},
}


def _module(path: Path) -> tuple[str, str]:
    """(module name, the package its relative imports resolve against)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The pipeplan modules ``path`` imports (``from x import y``: y when it is a module)."""
    mod, pkg = _module(path)
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("pipeplan"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
            out.update(subs or [target])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pipeplan"))
    out.discard(mod)
    return out


def _exists(mod: str) -> bool:
    p = SRC.joinpath(*mod.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _files() -> list[Path]:
    return sorted((SRC / "pipeplan").rglob("*.py"))


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return {_module(p)[0]: _imports(p, top_level_only=False) for p in _files()}


def test_every_room_is_known():
    rooms = {_room(_module(p)[0]) for p in _files()}
    assert rooms <= set(ALLOWED), f"rooms without a place in the data flow: {sorted(rooms - set(ALLOWED))}"


def test_no_import_runs_against_the_data_flow(edges):
    bad = sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                 if _room(b) != _room(a) and _room(b) not in ALLOWED[_room(a)] | BASE)
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_the_listed_cross_room_imports_are_gone(edges):
    """Issue 28's list: planners never import the runtime, learn never imports the runtime,
    the runtime never imports sim, operator sharding is not a pipeline planner."""
    for a, b in (("planners", "runtime"), ("learn", "runtime"), ("runtime", "sim"), ("planners", "sharding")):
        found = [f"{m} -> {t}" for m, ts in edges.items() for t in ts if _room(m) == a and _room(t) == b]
        assert not found, found
    assert not (SRC / "pipeplan" / "planners" / "pipedream.py").exists()
    assert (SRC / "pipeplan" / "cluster" / "symmetry.py").exists()


def test_no_module_level_import_cycle():
    graph = nx.DiGraph()
    for p in _files():
        mod = _module(p)[0]
        graph.add_node(mod)
        graph.add_edges_from((mod, t) for t in _imports(p, top_level_only=True))
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_walk_sees_a_violation(tmp_path, monkeypatch):
    """The checks above can fail: a runtime module importing the simulator is caught."""
    room = tmp_path / "pipeplan" / "runtime"
    room.mkdir(parents=True)
    (tmp_path / "pipeplan" / "sim.py").write_text("")
    (room / "__init__.py").write_text("")
    (room / "bad.py").write_text("from ..sim import simulate\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    found = _imports(room / "bad.py", top_level_only=True)
    assert found == {"pipeplan.sim"} and "sim" not in ALLOWED[_room("pipeplan.runtime.bad")]


def test_planner_options_are_parsed_in_one_place():
    """-O text becomes typed options once (planners/options.py); no planner filters another's
    option text (``extra=()``)."""
    for p in _files():
        text = p.read_text()
        assert "planner_options(" not in text and "extra=()" not in text, p
        if p.name != "options.py":
            assert "parse_options(" not in text or p.name == "base.py", p
