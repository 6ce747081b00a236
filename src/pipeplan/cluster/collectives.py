"""Collectives as NCCL runs them on GPU clusters, in nccl-tests' bus-bandwidth convention
(doc/PERFORMANCE.md): a collective of S bytes over n ranks moves ``bus_factor x S`` through
the slowest link of each rank, all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n
(S the whole array), all-to-all (n-1)/n (S one rank's array, of which it keeps 1/n), plus a
latency term: log2(n) steps of the group's largest link latency (NCCL's trees; twice for an
all-reduce, which reduces then broadcasts), never zero where the links have latency. An
all-to-all has no tree: NCCL posts its n - 1 peer exchanges as one group of sends and receives
and runs them in rounds, so its latency is n - 1 steps (the bound where the rounds do not
overlap; the expert all-to-alls of mixtures of experts pay it, docs/llm.md).

Context parallelism's key/value exchange (``ring_exchange_s``): Megatron-core's ring (its
``cp_comm_type`` p2p, Transformer Engine's attention) passes each rank's key/value block to the
next rank cp - 1 times, each send overlapped with the attention on the block in hand, so only
what a send takes beyond that block's compute is exposed; Llama 3's all-gather of keys and
values before the attention is ``collective_s("all_gather", ...)``.

An all-to-all's links (``exchange_links``): every rank's bytes for other servers cross its own
adapter, those for its server's members its links inside the server, at once.

A group's bus bandwidth on a cluster of servers: inside one server, the slowest link between
its members (NVLink through NVSwitch: any pair at full speed); across servers, each member
sends over its own adapter (one InfiniBand adapter per GPU, as on DGX servers) and NCCL
spreads the data over the adapters of a server's members, so the bottleneck is the server
with the fewest members x the slowest adapter, capped by the links inside it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .model import Cluster

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def bus_factor(kind: str, n):
    """nccl-tests' factor: bus bytes per byte of the collective's array (``n`` a count or an
    array of counts)."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {kind!r} (known: {', '.join(KINDS)})")


def latency_steps(kind: str, n):
    """The latency steps of a collective over ``n`` ranks: ceil(log2 n), twice for an
    all-reduce, n - 1 for an all-to-all (module docstring); 0 below 2 ranks."""
    if kind == "all_to_all":
        return np.maximum(np.asarray(n, dtype=float) - 1, 0.0) if np.ndim(n) else max(n - 1, 0)
    rounds = 2 if kind == "all_reduce" else 1
    if np.ndim(n):
        n = np.asarray(n, dtype=float)
        return np.where(n > 1, np.ceil(np.log2(np.maximum(n, 1.0))), 0.0) * rounds
    return math.ceil(math.log2(n)) * rounds if n > 1 else 0


def collective_s(kind: str, nbytes, n, bus_bytes_per_s, latency_s):
    """Seconds of one collective of ``nbytes`` over ``n`` ranks on links of
    ``bus_bytes_per_s`` and ``latency_s``: the one price of every collective in pipeplan.
    Scalars give a float; numpy arrays (broadcast together) an array, 0 where ``n`` < 2 or
    ``nbytes`` <= 0."""
    scalar = all(isinstance(x, (int, float)) for x in (n, nbytes, bus_bytes_per_s, latency_s))
    if scalar or not (np.ndim(n) or np.ndim(nbytes) or np.ndim(bus_bytes_per_s) or np.ndim(latency_s)):
        if n <= 1 or nbytes <= 0:
            return 0.0
        return bus_factor(kind, n) * nbytes / bus_bytes_per_s + latency_steps(kind, n) * latency_s
    n, nbytes = np.asarray(n, dtype=float), np.asarray(nbytes, dtype=float)
    live = (n > 1) & (nbytes > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = bus_factor(kind, np.maximum(n, 2.0)) * nbytes / bus_bytes_per_s + latency_steps(kind, n) * latency_s
    return np.where(live, t, 0.0)


def _shape(cluster: Cluster, group: Sequence[int]) -> tuple[int, int, float, float, float]:
    """(members n, the fewest members a server holds, the slowest link inside a server, the
    slowest adapter between servers, the largest latency) of ``group``; inf where no pair of
    devices shares (or spans) a server, latency 0 for one device."""
    idx = np.asarray(group, dtype=np.int64)
    servers = np.array([cluster.devices[i].server or cluster.devices[i].name for i in idx])
    _, members = np.unique(servers, return_counts=True)
    sub = cluster.bandwidth[np.ix_(idx, idx)]
    same = servers[:, None] == servers[None, :]
    off = same & ~np.eye(idx.size, dtype=bool)
    inside = float(sub[off].min()) if off.any() else math.inf
    adapter = float(sub[~same].min()) if (~same).any() else math.inf
    lat = float(cluster.latency[np.ix_(idx, idx)].max()) if idx.size > 1 else 0.0
    return idx.size, int(members.min()), inside, adapter, lat


def group_links(cluster: Cluster, group: Sequence[int]) -> tuple[float, float]:
    """(bus bandwidth in bytes/s, latency in s) of a collective over the devices ``group``
    (module docstring). The cluster's measured collective efficiency, if calibrated, scales
    the bandwidth."""
    _, k, inside, adapter, lat = _shape(cluster, group)
    return min(inside, k * adapter) * float(cluster.meta.get("allreduce_efficiency", 1.0)), lat


def exchange_links(cluster: Cluster, group: Sequence[int], remote_share: float | None = None) -> tuple[float, float]:
    """(bus bandwidth, latency) of an all-to-all over ``group``, for ``collective_s``: with k
    members in a server (the fewest) of n, a rank's array leaves it (k - 1) / n through the
    links inside its server and (n - k) / n through its own adapter, at once; the slower part
    sets the time, (n - 1) / n x S / bus with bus = (n - 1) / max((k - 1) / inside, (n - k) /
    adapter). Unlike a ring (``group_links``), no server's adapters carry a share of another's
    traffic: every rank's off-server bytes cross its own adapter. ``remote_share``: the share
    of the array that crosses the adapter where a sender sends less than (n - k) / n of it
    off its server (a dispatcher that sends a token once to each server and forwards it
    inside, ``llm.experts.remote_share``)."""
    if len(group) < 2:
        return 0.0, 0.0
    n, k, inside, adapter, lat = _shape(cluster, group)
    off = (n - k) / n if remote_share is None else remote_share
    per_byte = max((k - 1) / inside, off * n / adapter) if off > 0 else (k - 1) / inside
    return (n - 1) / per_byte * float(cluster.meta.get("allreduce_efficiency", 1.0)), lat


def servers_of(cluster: Cluster, group: Sequence[int]) -> int:
    """How many servers the devices ``group`` span."""
    return len({cluster.devices[i].server or cluster.devices[i].name for i in group})


def ring_exchange_s(block_bytes: float, cp: int, bytes_per_s: float, latency_s: float,
                    block_compute_s: float) -> float:
    """Exposed seconds of a context-parallel ring pass over ``cp`` ranks (module docstring):
    cp - 1 sends of one ``block_bytes`` key/value block to the next rank, each hidden behind
    the attention on the block in hand (``block_compute_s``) as far as it lasts. Backward
    passes key/value blocks and their gradients: call it with twice the bytes."""
    if cp <= 1 or block_bytes <= 0:
        return 0.0
    send = block_bytes / bytes_per_s + latency_s
    return (cp - 1) * max(0.0, send - block_compute_s)
