"""The LLM cost model's pieces (cluster/collectives.py, llm/costs.py) against their sources:
nccl-tests' bus-bandwidth convention, Megatron-LM's tensor-parallel collectives, the GEMM split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeplan.cluster import load_cluster
from pipeplan.cluster.kinds import kind
from pipeplan.errors import PipeplanError
from pipeplan.llm.spec import PRESETS, gpt
from pipeplan.cluster.collectives import collective_s, group_links
from pipeplan.llm.costs import gemm_s, layer_cost, tp_collectives

H100 = kind("H100-SXM")


@pytest.mark.parametrize("op, factor", [("all_reduce", lambda n: 2 * (n - 1) / n),
                                        ("all_gather", lambda n: (n - 1) / n),
                                        ("reduce_scatter", lambda n: (n - 1) / n)])
@pytest.mark.parametrize("n", [2, 8, 64])
def test_collectives_follow_the_nccl_tests_convention(op, factor, n):
    """doc/PERFORMANCE.md: busbw = algbw x factor, algbw = S / t."""
    size, busbw = 1e9, 100e9
    t = collective_s(op, size, n, busbw, 0.0)
    assert (size / t) * factor(n) == pytest.approx(busbw)
    assert collective_s(op, size, n, busbw, 5e-6) > t  # a latency term where links have one
    assert collective_s(op, size, 1, busbw, 5e-6) == 0.0


@pytest.mark.parametrize("n, steps", [(2, 1), (3, 2), (8, 3), (9, 4), (64, 6), (100, 7)])
def test_one_latency_convention_for_every_collective(n, steps):
    """NCCL's trees: ceil(log2 n) latency steps a pass, an all-reduce two passes, written out
    here; the seed papers' all-reduce (``allreduce_time``), the simulator's batched one
    (numpy arrays) and the LLM path's price the same."""
    from pipeplan.cluster import hierarchical
    from pipeplan.sim.formulas import allreduce_time

    size, busbw, lat = 1e6, 1e9, 1e-4
    assert collective_s("all_gather", size, n, busbw, lat) == pytest.approx((n - 1) / n * size / busbw + steps * lat)
    ar = 2 * (n - 1) / n * size / busbw + 2 * steps * lat
    assert collective_s("all_reduce", size, n, busbw, lat) == pytest.approx(ar)
    batched = collective_s("all_reduce", np.array([size, 0.0, size]), np.array([n, n, 1]), busbw, lat)
    assert batched == pytest.approx([ar, 0.0, 0.0])
    cl = hierarchical("ring", 1, n, busbw, busbw, latency=lat)
    assert allreduce_time(cl, list(range(n)), size) == pytest.approx(ar)


def test_group_links_on_dgx_servers():
    c = load_cluster("dgx-h100x2")
    eff = c.meta["allreduce_efficiency"]  # NCCL's share of the links' rate
    assert group_links(c, range(8)) == (450e9 * eff, 3e-6)  # NVLink inside a server
    assert group_links(c, [0, 8]) == (50e9 * eff, 6e-6)  # one 400 Gb/s adapter each
    assert group_links(c, range(16)) == (400e9 * eff, 6e-6)  # 8 adapters per server, capped by NVLink (450)
    assert group_links(c, [0, 1, 8]) == (50e9 * eff, 6e-6)  # the server with the fewest members


#: Korthikanti et al. 2022, Table 4: one layer of their 22B model (hidden 6144, 64 heads, sequence
#: 2048, microbatch 4, tensor-parallel 8 on a DGX A100), forward and backward ms, by
#: (recomputation, sequence parallelism). The baseline fixed the A100's GEMM efficiency
#: (cluster/kinds.py); the other four are predictions (within 2%).
KORTHIKANTI_TABLE4 = {("none", False): (7.7, 11.9), ("none", True): (7.2, 11.8), ("full", False): (7.7, 19.5),
                      ("selective", False): (7.7, 13.2), ("selective", True): (7.2, 13.1)}


@pytest.mark.parametrize("recompute, sp", list(KORTHIKANTI_TABLE4))
def test_a_22b_layer_on_a100s_takes_what_korthikanti_measured(recompute, sp):
    spec = gpt("22b", 6144, 48, 64)
    bus, lat = group_links(load_cluster("dgx-a100x1"), range(8))
    c = layer_cost(spec, kind("A100-80GB"), 4, 8, sp, recompute, bus, lat)
    ours = c.fwd_s + c.fwd_comm_s + c.recompute_s + c.bwd_s + c.bwd_comm_s
    fwd, bwd = KORTHIKANTI_TABLE4[recompute, sp]
    assert ours * 1e3 == pytest.approx(fwd + bwd, rel=0.003 if (recompute, sp) == ("none", False) else 0.02)
    assert (c.fwd_s + c.fwd_comm_s) * 1e3 == pytest.approx(fwd, rel=0.06)  # each pass near it too


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_collectives_are_megatrons(t):
    """Shoeybi et al. 2019 §3: 2 all-reduces a layer forward and 2 backward, each of the
    s x b x h activations (16-bit); with sequence parallelism (Korthikanti et al. 2022 §4.2.2)
    an all-gather and a reduce-scatter in their place, of the same bytes."""
    spec = PRESETS["gpt3-175b"]
    b = 2
    nbytes = 2 * spec.seq * b * spec.hidden
    fwd, bwd = tp_collectives(spec, b, t, sp=False)
    assert [(c.kind, c.count, c.nbytes) for c in fwd] == [("all_reduce", 2, nbytes)]
    assert [(c.kind, c.count, c.nbytes) for c in bwd] == [("all_reduce", 2, nbytes)]
    fwd, bwd = tp_collectives(spec, b, t, sp=True)
    assert sorted((c.kind, c.count, c.nbytes) for c in fwd) == [("all_gather", 2, nbytes), ("reduce_scatter", 2, nbytes)]
    # backward: the output gradients gathered, the input gradients reduce-scattered, and the
    # inputs gathered again for the weight gradients (the forward kept them sharded)
    assert sorted((c.kind, c.count, c.nbytes) for c in bwd) == [("all_gather", 4, nbytes), ("reduce_scatter", 2, nbytes)]
    assert tp_collectives(spec, b, 1, sp=True) == ((), ())


def test_tensor_parallelism_divides_the_gemms_and_adds_the_collectives():
    spec = gpt("g", 8192, 4, 64)
    c = load_cluster("dgx-h100x1")
    bus, lat = group_links(c, range(8))
    one = layer_cost(spec, H100, 2, 1)
    eight = layer_cost(spec, H100, 2, 8, tp_bus=bus, tp_latency=lat)
    assert one.fwd_comm_s == 0 and eight.fwd_comm_s > 0
    assert eight.params == pytest.approx(one.params / 8)
    assert one.fwd_s / 8 < eight.fwd_s < one.fwd_s / 4  # the overheads and memory-bound ops do not shrink 8x
    assert 1.8 * one.fwd_s < one.bwd_s < 2 * one.fwd_s  # GEMMs twice over, memory-bound ops less than twice
    full = layer_cost(spec, H100, 2, 8, recompute="full", tp_bus=bus, tp_latency=lat)
    assert full.recompute_s == pytest.approx(eight.fwd_s)
    assert full.bwd_comm_s == pytest.approx(eight.bwd_comm_s + eight.fwd_comm_s)  # the recomputed forward's, exposed


@pytest.mark.parametrize("sp", [False, True])
def test_the_backward_collectives_hide_behind_the_qkv_and_first_mlp_gemms(sp):
    """On a slow link (1 GB/s, no latency): without SP the two input-gradient all-reduces less
    the QKV and first MLP GEMMs (each F / (peak x efficiency) + overhead); with SP the two
    output-gradient all-gathers in full, plus two all-gathers and two reduce-scatters less the
    same GEMMs' input- and weight-gradient halves."""
    spec, b, t, bus = gpt("g", 4096, 4, 32, seq=1024), 1, 8, 1e9
    nbytes, tokens = 2 * 1024 * b * 4096, 1024 * b
    gemm = sum(2.0 * tokens * 4096 * width / t / (989e12 * H100.gemm_efficiency) + H100.gemm_overhead_s
               for width in (3 * 4096, 4 * 4096))  # QKV (no GQA) and fc1
    ring_ar, ring_half = 2 * (t - 1) / t * nbytes / bus, (t - 1) / t * nbytes / bus
    c = layer_cost(spec, H100, b, t, sp, "none", bus, 0.0)
    want = 2 * ring_half + max(0.0, 4 * ring_half - 2 * gemm) if sp else max(0.0, 2 * ring_ar - gemm)
    assert c.bwd_comm_s == pytest.approx(want, rel=1e-9)
    assert layer_cost(spec, H100, b, t, sp, "none", 1e15, 0.0).bwd_comm_s == pytest.approx(
        2 * (t - 1) / t * nbytes / 1e15 if sp else 0.0, abs=1e-12)


def test_memory_bound_bytes_each_way_are_the_ops_reads_and_writes():
    """A GPT layer's forward moves 30h bytes a token outside the MLP (two norms 2 x 4h, two
    residual adds 2 x 6h, two dropouts 2 x 5h) and 4 ffn in GELU; its backward 34h (norms read x
    and dy and write dx: 2 x 6h; the residual gradients added: 2 x 6h; dropouts: 2 x 5h) and 6
    ffn (GELU reads x and dy, writes dx)."""
    from pipeplan.llm.costs import elementwise_bytes as _elementwise_bytes

    spec = gpt("g", 1024, 2, 16)
    assert _elementwise_bytes(spec, 10) == (10 * 30 * 1024, 10 * 4 * 4096)
    assert _elementwise_bytes(spec, 10, backward=True) == (10 * 34 * 1024, 10 * 6 * 4096)


def test_gemm_time_is_flops_over_the_fitted_rate_plus_overhead():
    assert gemm_s(H100, 989e12 * H100.gemm_efficiency) == pytest.approx(1.0 + H100.gemm_overhead_s)
    with pytest.raises(PipeplanError, match="no measured bf16 GEMM efficiency"):
        gemm_s(kind("V100"), 1e9)


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(PipeplanError, match="cannot be split over 16 tensor-parallel ranks"):
        layer_cost(gpt("g", 2304, 2, 24), H100, 1, 16, tp_bus=1e9)


MEASURED_H100 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu" / "gemm_nvidia-h100-80gb-hbm3.json"


def test_the_h100_gemm_model_reproduces_the_measured_gemms():
    """The H100-SXM kind's GEMM efficiency and overhead against 512 GEMMs timed on a lent H100
    (benchmarks/gpu/gemm_efficiency.py): median error under 5%, 90% of shapes within 15%."""
    rows = json.loads(MEASURED_H100.read_text())["gemms"]
    errors = sorted(abs(gemm_s(H100, 2.0 * r["m"] * r["n"] * r["k"]) / r["seconds"] - 1) for r in rows)
    assert len(errors) == 512
    assert errors[len(errors) // 2] < 0.05 and errors[int(0.9 * len(errors))] < 0.15


def test_llm_graphs_are_costed_as_the_h100_kind_and_scaled_to_the_reference():
    from pipeplan.graph import load_graph
    from pipeplan.llm.costs import H100_SPEED, REFERENCE, layer_compute_s

    assert (REFERENCE.peak, REFERENCE.gemm_efficiency, REFERENCE.gemm_overhead_s, REFERENCE.hbm) == \
        (H100.bf16_flops, H100.gemm_efficiency, H100.gemm_overhead_s, H100.hbm_bytes_per_s)
    assert H100_SPEED == H100.speed
    g = load_graph("zoo:llama3-8b")
    fwd, bwd, _ = layer_compute_s(PRESETS["llama3-8b"], REFERENCE, 1)
    assert (g.fwd[1] / H100.speed, g.bwd[1] / H100.speed) == pytest.approx((fwd, bwd))


def test_full_data_parallelism_of_llama3_8b_does_not_fit_an_80_gb_h100(capsys):
    """8.03B parameters x 18 bytes = 145 GB of weights, gradients and Adam state per replica."""
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:llama3-8b", "--cluster", "dgx-h100x1", "--planner", "dp",
                 "--microbatches", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prediction"]["over_memory"] == [f"s0g{i}" for i in range(8)]
