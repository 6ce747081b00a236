"""The all-to-all (expert parallelism's dispatch and combine) and context parallelism's key/value
exchange, priced by cluster/collectives.py, against their closed forms: bytes each rank sends,
latency steps, and what a ring exposes beyond the compute it overlaps."""

from __future__ import annotations

import numpy as np
import pytest

from pipeplan.cluster.collectives import collective_s, latency_steps, ring_exchange_s


@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_an_all_to_all_sends_all_but_its_own_share_and_pays_n_minus_1_latencies(n):
    """A rank of an n-way all-to-all holds S bytes, keeps S/n and sends S (n-1)/n over its link
    (nccl-tests' alltoall bus bandwidth), in n - 1 peer exchanges."""
    s, bw, lat = 64e6, 50e9, 5e-6
    assert latency_steps("all_to_all", n) == n - 1
    assert collective_s("all_to_all", s, n, bw, lat) == pytest.approx(s * (n - 1) / n / bw + (n - 1) * lat)


def test_the_all_to_all_batched_equals_the_scalar_and_is_free_alone():
    n = np.array([1, 2, 4, 16])
    got = collective_s("all_to_all", np.full(4, 1e6), n, 10e9, 2e-6)
    assert got[0] == 0.0 and collective_s("all_to_all", 1e6, 1, 10e9, 2e-6) == 0.0
    assert np.allclose(got[1:], [collective_s("all_to_all", 1e6, int(k), 10e9, 2e-6) for k in n[1:]])
    assert np.array_equal(latency_steps("all_to_all", n), [0, 1, 3, 15])


def test_a_ring_exposes_only_what_each_send_takes_beyond_its_block():
    """cp - 1 sends of one block: hidden behind a longer block of attention, exposed by their
    excess over a shorter one (bytes / bandwidth + one latency each)."""
    block, bw, lat = 16e6, 100e9, 4e-6
    send = block / bw + lat  # 164 us
    assert ring_exchange_s(block, 1, bw, lat, 0.0) == 0.0
    assert ring_exchange_s(block, 8, bw, lat, 1e-3) == 0.0  # 1 ms of attention a block hides it
    assert ring_exchange_s(block, 8, bw, lat, 100e-6) == pytest.approx(7 * (send - 100e-6))
    assert ring_exchange_s(block, 4, bw, lat, 0.0) == pytest.approx(3 * send)


def test_llama3s_all_gather_of_keys_and_values_is_the_all_gather():
    """Llama 3 gathers every rank's keys and values before the attention (Dubey et al. 2024,
    §3.3.2): each rank receives (cp - 1) blocks, log2(cp) latency steps."""
    block, cp, bw, lat = 2e6, 16, 50e9, 8e-6
    whole = cp * block
    assert collective_s("all_gather", whole, cp, bw, lat) == pytest.approx((cp - 1) * block / bw + 4 * lat)


@pytest.mark.parametrize("servers, per", [(1, 8), (2, 8), (8, 8), (4, 2)])
def test_an_all_to_all_across_servers_sends_each_ranks_share_over_its_own_adapter(servers, per):
    """On hgx-h800 servers (NVLink 200 GB/s a direction, one 50 GB/s adapter a GPU): an
    n-way all-to-all of k ranks a server moves a rank's S (k - 1) / n through NVLink and
    S (n - k) / n through its adapter at once; the slower sets the time, at the cluster's
    collective efficiency (its meta's, 0.8 on these servers)."""
    from pipeplan.cluster import load_cluster
    from pipeplan.cluster.collectives import exchange_links

    cl = load_cluster(f"hgx-h800x{servers}")
    group = [s * 8 + g for s in range(servers) for g in range(per)]
    n, k, size = len(group), per, 64e6
    nvlink = float(cl.bandwidth[0, 1])
    adapter = float(cl.bandwidth[0, 8]) if servers > 1 else np.inf
    assert nvlink == pytest.approx(200e9) and (servers == 1 or adapter == pytest.approx(50e9))
    want = max(size * (k - 1) / n / nvlink, size * (n - k) / n / adapter) / 0.8
    assert cl.meta["allreduce_efficiency"] == 0.8
    bus, lat = exchange_links(cl, group)
    got = collective_s("all_to_all", size, n, bus, lat) - (n - 1) * lat
    assert got == pytest.approx(want)
