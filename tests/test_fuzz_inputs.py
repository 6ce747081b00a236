"""Fuzzing the files users give (graph, cluster and plan files): whatever they hold, pipeplan
exits 0 with its output written, or 2 with one line and no output file; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.cli import main

from helpers import CLUSTER_DICT, GRAPH_DICT

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)

GRAPH, CLUSTER = GRAPH_DICT, CLUSTER_DICT


def mutate(base: dict, path: list, value) -> dict:
    """``base`` with the field at ``path`` (keys / indices, followed as far as they go) set to ``value``."""
    out = json.loads(json.dumps(base))
    node = out
    for step in path[:-1]:
        if isinstance(node, dict):
            nxt = node.get(step if isinstance(step, str) else str(step))
        else:
            nxt = node[step % len(node)] if node and isinstance(step, int) else None
        if not isinstance(nxt, (dict, list)):
            break
        node = nxt
    last = path[-1]
    if isinstance(node, dict):
        node[last if isinstance(last, str) else str(last)] = value
    elif node:
        node[last % len(node) if isinstance(last, int) else 0] = value
    return out


def graph_paths():
    keys = st.sampled_from(["format", "name", "meta", "nodes", "edges", "id", "fwd_s", "bwd_s", "params_bytes",
                            "act_bytes", "inplace", "saved_bytes", "microbatch"])
    return st.lists(st.one_of(keys, st.integers(0, 3)), min_size=1, max_size=4)


def cluster_paths():
    keys = st.sampled_from(["name", "devices", "bandwidth", "latency", "servers", "links", "kind", "memory",
                            "speed", "inter", "intra", "gpus", "duplex", "allreduce_efficiency"])
    return st.lists(st.one_of(keys, st.integers(0, 2)), min_size=1, max_size=3)


def run(argv: list[str], out: Path, capsys) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert not out.exists()
    else:
        assert json.loads(out.read_text())
        out.unlink()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".pipeplan-")]  # no temporary left


@SETTINGS
@given(path=graph_paths(), value=values)
def test_graph_files(tmp_path, capsys, path, value):
    g = tmp_path / "g.json"
    g.write_text(json.dumps(mutate(GRAPH, path, value), allow_nan=True))
    run(["plan", "--model", str(g), "--cluster", "v100x4", "--planner", "gpipe", "--microbatches", "4",
         "--out", str(tmp_path / "p.json")], tmp_path / "p.json", capsys)


@SETTINGS
@given(path=cluster_paths(), value=values)
def test_cluster_files(tmp_path, capsys, path, value):
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump(mutate(CLUSTER, path, value)))
    run(["plan", "--model", "zoo:alexnet", "--cluster", str(c), "--planner", "dp", "--microbatches", "4",
         "--out", str(tmp_path / "p.json")], tmp_path / "p.json", capsys)


@SETTINGS
@given(path=st.lists(st.one_of(st.sampled_from(["planner", "schedule", "microbatches", "optimizer", "replicas",
                                                "stages", "nodes", "devices", "recompute", "allocation", "graph",
                                                "cluster"]), st.integers(0, 3)), min_size=1, max_size=3),
       value=values)
def test_plan_files(tmp_path, capsys, path, value):
    base = tmp_path / "base.json"
    if not base.exists():
        assert main(["plan", "--model", "zoo:alexnet", "--cluster", "v100x4", "--planner", "gpipe",
                     "--microbatches", "4", "--out", str(base)]) == 0
        capsys.readouterr()
    p = tmp_path / "p.json"
    p.write_text(json.dumps(mutate(json.loads(base.read_text()), path, value), allow_nan=True))
    run(["simulate", str(p), "--trace", str(tmp_path / "t.json")], tmp_path / "t.json", capsys)


@SETTINGS
@given(path=st.lists(st.one_of(st.sampled_from(["tp", "zero", "selective_recompute", "sequence_parallel",
                                                "overlap_grad_reduce", "stages",
                                                "devices", "nodes", "microbatches", "replicas", "recompute", "graph",
                                                "meta", "decoder", "microbatch", "heads", "hidden", "kv_heads",
                                                "cluster", "kind"]), st.integers(0, 3)), min_size=1, max_size=4),
       value=values)
def test_tensor_parallel_plan_files(tmp_path, capsys, path, value):
    """A decoder LLM's 3D plan (TP groups, selective recomputation, ZeRO-1) mutated anywhere."""
    base = tmp_path / "base.json"
    if not base.exists():
        assert main(["plan", "--model", "zoo:gpt?hidden=512&layers=4&heads=8&seq=256&vocab=4096", "--cluster",
                     "dgx-h100x1", "--planner", "megatron", "-O", "tp=2", "-O", "pp=2", "-O", "recompute=selective",
                     "-O", "zero=1", "--global-batch", "8", "--out", str(base)]) == 0
        capsys.readouterr()
    p = tmp_path / "p.json"
    p.write_text(json.dumps(mutate(json.loads(base.read_text()), path, value), allow_nan=True))
    run(["simulate", str(p), "--trace", str(tmp_path / "t.json")], tmp_path / "t.json", capsys)
