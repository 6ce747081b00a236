"""The GPUs and servers LLMs train on (cluster/kinds.py, cluster/presets.py): data-sheet peaks,
DGX presets with NVLink inside and one InfiniBand adapter per GPU between servers."""

from __future__ import annotations

import pytest

from pipeplan.cluster import load_cluster
from pipeplan.cluster.kinds import kind
from pipeplan.errors import PipeplanError

GiB = 2**30


@pytest.mark.parametrize("name, memory, tflops, hbm", [("A100-40GB", 40, 312, 1555), ("A100-80GB", 80, 312, 2039),
                                                       ("H100-SXM", 80, 989, 3350)])
def test_kinds_carry_bf16_peak_and_hbm_bandwidth(name, memory, tflops, hbm):
    k = kind(name)
    assert (k.memory, k.bf16_flops, k.hbm_bytes_per_s) == (memory * GiB, tflops * 1e12, hbm * 1e9)


@pytest.mark.parametrize("spec, kind_name, nvlink, ib", [("dgx-a100x4", "A100-80GB", 300e9, 25e9),
                                                         ("dgx-h100x2", "H100-SXM", 450e9, 50e9),
                                                         ("hgx-h800x2", "H800", 200e9, 50e9)])
def test_dgx_presets(spec, kind_name, nvlink, ib):
    c = load_cluster(spec)
    servers = int(spec.rsplit("x", 1)[1])
    assert len(c) == 8 * servers and {d.kind for d in c.devices} == {kind_name}
    assert [d.server for d in c.devices[7:9]] == ["s0", "s1"]
    assert c.bandwidth[0, 7] == nvlink and c.bandwidth[7, 8] == ib  # one direction of a link
    assert c.latency[0, 7] > 0 and c.latency[7, 8] > c.latency[0, 7]  # never zero latency


@pytest.mark.parametrize("spec, words", [("dgx-h100x0", "needs at least one server"),
                                         ("dgx-b200x2", "unknown cluster preset"), ("hgx-h800x0", "at least one"),
                                         ("dgx-h800x2", "unknown cluster preset")])
def test_bad_dgx_presets(spec, words):
    with pytest.raises(PipeplanError, match=words):
        load_cluster(spec)


def test_the_h800_is_the_h100s_silicon_with_less_nvlink():
    """NVIDIA's H800 SXM: the H100's tensor cores and HBM3 (989 TFLOP/s bf16, 3,350 GB/s), NVLink
    400 GB/s both directions against the H100's 900."""
    from pipeplan.cluster.kinds import KINDS

    h800, h100 = KINDS["h800"], KINDS["h100-sxm"]
    assert (h800.bf16_flops, h800.hbm_bytes_per_s, h800.memory) == (989e12, 3350e9, h100.memory)
    assert (h800.gemm_efficiency, h800.gemm_overhead_s) == (h100.gemm_efficiency, h100.gemm_overhead_s)
    assert load_cluster("hgx-h800x1").bandwidth[0, 1] * 2 == 400e9
