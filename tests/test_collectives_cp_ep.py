"""The all-to-all (expert parallelism's dispatch and combine) and context parallelism's key/value
exchange, priced by cluster/collectives.py, against their closed forms: bytes each rank sends,
latency steps, and what a ring exposes beyond the compute it overlaps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeplan.cluster.collectives import collective_s, latency_steps, ring_exchange_s
from pipeplan.llm.spec import PRESETS


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


def _mean_servers_by_enumeration(groups: int, servers: int, chosen: int) -> float:
    """Every way of choosing ``chosen`` of ``groups`` router groups (groups laid out in order,
    groups / servers to a server), equally likely: the servers they lie on, on average."""
    from itertools import combinations

    per = groups // servers
    picks = list(combinations(range(groups), chosen))
    return sum(len({g // per for g in pick}) for pick in picks) / len(picks)


@pytest.mark.parametrize("groups, servers, chosen", [(8, 8, 4), (8, 4, 4), (8, 2, 2), (16, 4, 2), (8, 4, 1)])
def test_group_limited_routing_reaches_the_servers_enumeration_counts(groups, servers, chosen):
    from pipeplan.llm.experts import servers_reached

    spec = replace(PRESETS["deepseek-v3"], route_groups=groups, route_group_topk=chosen, top_k=8)
    assert servers_reached(spec, servers) == pytest.approx(_mean_servers_by_enumeration(groups, servers, chosen))


def test_deepeps_dispatch_sends_deepseek_v3s_token_to_4_nodes_and_the_all_to_all_7_of_8_copies():
    """DeepSeek-V3 §3.2.2: at most 4 nodes a token (8 groups, 4 chosen, a node's experts one
    group at EP 64 on 8 servers); one of the 4 is the sender's own 1 time in 8, so 3.5 copies of
    the 8 cross the network, against 7 of 8 with Megatron-core's all-to-all."""
    from pipeplan.llm.experts import ExpertCut, remote_share

    spec = PRESETS["deepseek-v3"]
    assert remote_share(spec, ExpertCut(64, dispatcher="deepep"), 8) == pytest.approx(3.5 / 8)
    assert remote_share(spec, ExpertCut(64), 8) is None  # the all-to-all's own (n - k) / n
    plain = replace(spec, route_groups=0, route_group_topk=0)  # top-8 of 256 uniform: 8 (1 - (7/8)^8) servers
    assert remote_share(plain, ExpertCut(64, dispatcher="deepep"), 8) == pytest.approx(8 * (1 - (7 / 8) ** 8) * 7 / 64)


def test_an_all_to_all_sending_less_off_its_server_takes_its_adapters_share():
    """64 ranks on 8 H800 servers, 64 MB a rank: a dispatcher sending 3.5/8 of its array off the
    server crosses the 50 GB/s adapter with that share, the rest over NVLink at 200 GB/s."""
    from pipeplan.cluster import load_cluster
    from pipeplan.cluster.collectives import exchange_links

    cl, size = load_cluster("hgx-h800x8"), 64e6
    bus, lat = exchange_links(cl, list(range(64)), 3.5 / 8)
    want = max(size * 7 / 64 / 200e9, size * 3.5 / 8 / 50e9) / 0.8
    assert collective_s("all_to_all", size, 64, bus, lat) - 63 * lat == pytest.approx(want)
