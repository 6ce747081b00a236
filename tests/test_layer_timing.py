"""benchmarks/gpu/layer_timing.py on a CPU (its tiny shapes, fp32) and without a GPU, and
cluster/measured.py's reading of its results files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeplan.cluster.measured import gpu_kind, is_measured, layer_timings

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "layer_timing.py"
RESULTS = ROOT / "benchmarks" / "results" / "gpu"


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def rank_params(r: dict) -> int:
    """One tensor-parallel rank's parameters, by hand. GPT: QKV 3h^2 + 3h, output h^2 + h, MLP
    4h^2 + 4h and 4h^2 + h, two LayerNorms 2h each; the column-parallel matrices and biases
    divided over the ranks, the row-parallel biases and the norms whole. Llama: QKV h(h + 2kv),
    output h^2, SwiGLU 3h x ffn, two RMSNorms h each, no biases."""
    h, t = r["hidden"], r["tp"]
    if r["model"] == "gpt-tiny":
        return (12 * h * h + 3 * h + 4 * h) // t + 2 * h + 4 * h
    kv = r["kv_heads"] * h // r["heads"]
    return (h * (h + 2 * kv) + h * h + 3 * h * r["ffn"]) // t + 2 * h


def rank_flops(r: dict) -> float:
    """One rank's forward FLOPs, by hand: GPT 24bsh^2 + 4bs^2h; Llama its projections
    2bsh(h + 2kv) + 2bsh^2, SwiGLU 6bsh x ffn and the attention core 4bs^2h; over tp."""
    h, s, b = r["hidden"], r["seq"], r["microbatch"]
    core = 4 * b * s * s * h
    if r["model"] == "gpt-tiny":
        return (24 * b * s * h * h + core) / r["tp"]
    kv = r["kv_heads"] * h // r["heads"]
    return (2 * b * s * h * (h + 2 * kv) + 2 * b * s * h * h + 6 * b * s * h * r["ffn"] + core) / r["tp"]


@pytest.mark.slow
def test_tiny_layers_on_cpu(tmp_path):
    # --quick: with --tiny the same four shapes, 5 repeats of each measurement instead of 10
    done = run_script("--device", "cpu", "--tiny", "--quick", "--out", str(tmp_path), OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "layer_timing_cpu.json").read_text())
    assert data["provenance"]["command"].startswith(".venv/bin/python benchmarks/gpu/layer_timing.py")
    assert data["gpu"] == "cpu" and data["dtype"] == "float32"
    rows = data["rows"]
    assert data["repeat"] == 5
    assert {(r["model"], r["tp"]) for r in rows} == {(m, t) for m in ("gpt-tiny", "llama-tiny") for t in (1, 2)}
    for r in rows:
        # timings only exist and are positive (the suite checks no wall-clock ratio: a loaded
        # machine may run any of them slower)
        assert all(r[k] > 0 for k in ("fwd_s", "bwd_s", "recompute_fwd_s", "optimizer_step_s")), r
        assert 0 < r["attn_core_s"] and 0 < r["optimizer_step_s"], r
        assert r["params"] == rank_params(r), r
        assert r["fwd_flops"] == rank_flops(r), r
        assert r["fwd_tflops"] == pytest.approx(r["fwd_flops"] / r["fwd_s"] / 1e12)
    gpt = next(r for r in rows if r["model"] == "gpt-tiny" and r["tp"] == 1)
    assert (gpt["norm"], gpt["gated"], gpt["ffn"]) == ("layernorm", False, 4 * gpt["hidden"])


def test_without_a_gpu_says_so_and_writes_nothing(tmp_path):
    before = sorted(RESULTS.iterdir()) if RESULTS.is_dir() else []
    done = run_script("--out", str(tmp_path / "out"), CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "GPU" in done.stderr
    assert not (tmp_path / "out").exists()
    assert (sorted(RESULTS.iterdir()) if RESULTS.is_dir() else []) == before


def test_measured_rows_by_kind(tmp_path):
    rows = [{"model": "llama3-8b", "tp": 8, "fwd_s": 0.01}]
    (tmp_path / "layer_timing_nvidia-a100-sxm4-80gb.json").write_text(
        json.dumps({"provenance": {}, "gpu": "NVIDIA A100-SXM4-80GB", "rows": rows}))
    (tmp_path / "layer_timing_nvidia-h200.json").write_text(json.dumps({"gpu": "NVIDIA H200", "rows": rows}))
    (tmp_path / "layer_timing_broken.json").write_text("{not json")
    assert layer_timings("A100-80GB", root=tmp_path) == rows
    assert layer_timings("a100-80gb", root=tmp_path) == rows and is_measured("A100-80GB", root=tmp_path)
    for kind in ("A100-40GB", "H100-SXM", "V100", "no-such-kind"):
        assert layer_timings(kind, root=tmp_path) is None and not is_measured(kind, root=tmp_path)
    assert layer_timings("A100-80GB", root=tmp_path / "absent") is None  # an installed wheel: no results


def test_gpu_names_to_kinds():
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert gpu_kind("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert gpu_kind("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    for other in ("NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe", "Tesla V100-SXM2-32GB", "cpu"):
        assert gpu_kind(other) is None
