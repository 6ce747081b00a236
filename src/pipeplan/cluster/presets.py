"""Named clusters from the seed papers' evaluations, and the ``hier:`` spec string."""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from ..errors import PipeplanError
from ..units import parse_bandwidth, parse_bytes, parse_time
from .build import hierarchical
from .model import Cluster, Device

Gbps = 1e9 / 8


def spp_like(servers: int = 8, gpus: int = 4, inter: tuple[float, float] = (32, 40),
             pcie_servers: int | None = None, seed: int = 0, name: str = "spp-sim") -> Cluster:
    """SPP §V-B's simulated clusters: V100 servers, the first ``pcie_servers`` (default: 3 of
    8, in proportion) with intra-server links drawn from U[96,128] Gbps (PCIe), the others
    from U[160,200] Gbps (NVLink), links between servers from U[inter] Gbps. One draw per GPU
    pair inside a server and per server pair; a fixed seed."""
    rng = np.random.default_rng(seed)
    if pcie_servers is None:
        pcie_servers = int(servers * 3 / 8 + 0.5)  # 3 of 8, rounded half up
    c = hierarchical(name, servers, gpus, 1.0, 1.0, kind="V100",
                     meta={"source": "SPP §V-B", "seed": seed, "inter_gbps": list(inter)})
    v = servers * gpus
    bw = np.zeros((v, v))
    between = rng.uniform(inter[0], inter[1], size=(servers, servers)) * Gbps
    between = np.triu(between, 1) + np.triu(between, 1).T
    for a in range(servers):
        for b in range(servers):
            bw[gpus * a:gpus * (a + 1), gpus * b:gpus * (b + 1)] = between[a, b]
    for s in range(servers):
        lo, hi = (96, 128) if s < pcie_servers else (160, 200)
        intra = rng.uniform(lo, hi, size=(gpus, gpus)) * Gbps
        bw[gpus * s:gpus * (s + 1), gpus * s:gpus * (s + 1)] = np.triu(intra, 1) + np.triu(intra, 1).T
    return Cluster(name, c.devices, bw, c.latency, meta=c.meta)


def _spp_sim(seed: int = 0) -> Cluster:
    """SPP §V-B default: 8 servers x 4 V100; servers 0-2 intra-server links drawn from
    U[96,128] Gbps (PCIe), servers 3-7 from U[160,200] Gbps (NVLink), links between servers
    from U[32,40] Gbps (RDMA)."""
    return spp_like(8, 4, (32, 40), 3, seed)


def _automap(servers: int, name: str) -> Cluster:
    # Auto-MAP Table 2: 8x V100 per server over NVLink, 25 Gbps between servers. NVLink 2.0
    # gives 25 GB/s per link per direction; we take two links (50 GB/s) per GPU pair.
    return hierarchical(name, servers, 8, 400 * Gbps, 25 * Gbps, kind="V100",
                        meta={"source": "Auto-MAP Table 2"})


MOBILE_KINDS = ("laptop-i7-gtx1650", "laptop-i5-irisxe", "rpi4b")


def mobile_hetero(n: int, seed: int = 0) -> Cluster:
    """resalloc.txt §VI: n devices drawn uniformly (seeded) from the three mobile kinds, 1 Gbps links."""
    from .kinds import kind as lookup_kind

    rng = np.random.default_rng(seed)
    devices = []
    for i, k in enumerate(rng.choice(len(MOBILE_KINDS), size=n)):
        kd = lookup_kind(MOBILE_KINDS[int(k)])
        devices.append(Device(f"m{i}", kd.name, kd.memory, kd.speed, f"m{i}", kd.resources))
    bw = np.full((n, n), 1 * Gbps)
    return Cluster(f"mobile-hetero-{n}", devices, bw, np.zeros((n, n)),
                   meta={"source": "resalloc §VI", "seed": seed})


PRESETS: dict[str, tuple[str, Callable[[], Cluster]]] = {
    "mobile-4": ("4 laptops (Intel i7 CPU + GTX 1650 GPU each), 1 Gbps links (resalloc §VI)",
                 lambda: hierarchical("mobile-4", 4, 1, 1 * Gbps, 1 * Gbps, kind="laptop-i7-gtx1650",
                                      meta={"source": "resalloc §VI"})),
    "v100x4": ("one server, 4 V100 over PCIe 128 Gbps (SPP testbed 2)",
               lambda: hierarchical("v100x4", 1, 4, 128 * Gbps, 128 * Gbps, kind="V100",
                                    meta={"source": "SPP §V-A testbed 2"})),
    "1080ti-4x2": ("4 servers x 2 GTX 1080 Ti, PCIe 128 Gbps inside, 50 Gbps between (SPP testbed 1)",
                   lambda: hierarchical("1080ti-4x2", 4, 2, 128 * Gbps, 50 * Gbps, kind="1080Ti",
                                        meta={"source": "SPP §V-A testbed 1"})),
    "spp-sim": ("8 servers x 4 V100, uneven links, seed 0 (SPP simulation default)", _spp_sim),
    "automap-a": ("2 servers x 8 V100 NVLink, 25 Gbps between (Auto-MAP config A)",
                  lambda: _automap(2, "automap-a")),
    "automap-b": ("3 servers x 8 V100 NVLink, 25 Gbps between (Auto-MAP config B)",
                  lambda: _automap(3, "automap-b")),
    "automap-c": ("4 servers x 8 V100 NVLink, 25 Gbps between (Auto-MAP config C)",
                  lambda: _automap(4, "automap-c")),
    "drlpp-4gpu": ("one server, 4 GPUs (V100 assumed) over PCIe 128 Gbps (DRL-PP testbed)",
                   lambda: hierarchical("drlpp-4gpu", 1, 4, 128 * Gbps, 128 * Gbps, kind="V100",
                                        meta={"source": "DRL-PP §4"})),
}


#: DGX servers (NVIDIA's DGX A100 and DGX H100 user guides): 8 GPUs on NVSwitch, NVLink 600 GB/s
#: (A100) or 900 GB/s (H100) per GPU counting both directions, so 300 or 450 GB/s each way
#: between any two GPUs of a server; between servers one InfiniBand adapter per GPU, 200 Gb/s
#: HDR (A100) or 400 Gb/s NDR (H100) each way. Latencies (per message) are assumptions:
#: 3 us over NVLink, 6 us over InfiniBand (docs/llm.md). NCCL's collectives reach 80% of the
#: links' rate (``allreduce_efficiency``), an assumption to calibrate on published runs.
#: HGX H800 servers (DeepSeek-V3's cluster, DeepSeek-AI 2024 §3.1): the H100's silicon with
#: NVLink cut to 400 GB/s per GPU counting both directions (200 GB/s each way), NVSwitch inside,
#: one 400 Gb/s InfiniBand adapter (CX7) per GPU between servers.
DGX_NCCL_EFFICIENCY = 0.8
DGX = {"dgx-a100": ("A100-80GB", 300e9, 200 * Gbps, "NVIDIA DGX A100"),
       "dgx-h100": ("H100-SXM", 450e9, 400 * Gbps, "NVIDIA DGX H100"),
       "hgx-h800": ("H800", 200e9, 400 * Gbps, "NVIDIA HGX H800")}
DGX_LATENCY = (3e-6, 6e-6)
DGX_PATTERN = re.compile(r"(dgx-a100|dgx-h100|hgx-h800)x(\d+)")


def dgx(server: str, servers: int) -> Cluster:
    """``dgx-a100xN``, ``dgx-h100xN``, ``hgx-h800xN``: N servers of 8 GPUs (``DGX``)."""
    kind, nvlink, ib, what = DGX[server]
    return hierarchical(f"{server}x{servers}", servers, 8, nvlink, ib, kind=kind, latency=DGX_LATENCY,
                        meta={"source": f"{what}: NVSwitch inside, one InfiniBand adapter per GPU",
                              "allreduce_efficiency": DGX_NCCL_EFFICIENCY})


#: Presets named with a count N: name -> (devices, description)
SIZED_PRESETS: dict[str, tuple[str, str]] = {
    "mobile-hetero-N": ("N", "N devices drawn (seeded) from the three mobile kinds, 1 Gbps links (resalloc §VI)"),
    "dgx-a100xN": ("8N", "N DGX A100 servers: 8 A100-80GB on NVLink (300 GB/s each way), one 200 Gb/s InfiniBand "
                   "adapter per GPU between servers"),
    "dgx-h100xN": ("8N", "N DGX H100 servers: 8 H100-SXM on NVLink (450 GB/s each way), one 400 Gb/s InfiniBand "
                   "adapter per GPU between servers"),
    "hgx-h800xN": ("8N", "N HGX H800 servers: 8 H800 on NVLink (200 GB/s each way), one 400 Gb/s InfiniBand "
                   "adapter per GPU between servers (DeepSeek-V3's cluster)"),
}


def preset(name: str) -> Cluster:
    if m := DGX_PATTERN.fullmatch(name):
        if int(m.group(2)) < 1:
            raise PipeplanError(f"cluster {name!r}: needs at least one server")
        return dgx(m.group(1), int(m.group(2)))
    entry = PRESETS.get(name)
    if entry is None and name.startswith("mobile-hetero-") and name[len("mobile-hetero-"):].isdigit():
        n = int(name[len("mobile-hetero-"):])
        if n < 1:
            raise PipeplanError(f"cluster {name!r}: needs at least one device")
        return mobile_hetero(n)
    if entry is None:
        raise PipeplanError(f"unknown cluster preset {name!r} (known: {', '.join([*PRESETS, *SIZED_PRESETS])})")
    return entry[1]()


_HIER_KEYS = {"servers", "gpus", "intra", "inter", "kind", "latency", "memory", "speed"}


def _hier_bandwidth(spec: str, key: str, text: str, links_devices: bool) -> float:
    """The bandwidth ``key=text`` of a ``hier:`` spec; zero is refused where it would be the
    only link between two devices (a 0 Gbps link is no link: the devices could not talk)."""
    value = parse_bandwidth(text, f"hier {key}")
    if value == 0 and links_devices:
        raise PipeplanError(f"cluster {spec!r}: {key}={text} is no link (devices of a hier: cluster "
                            "must all be linked; give a bandwidth > 0)")
    return value


def parse_hier(spec: str) -> Cluster:
    """``hier:servers=4,gpus=2,intra=128Gbps,inter=50Gbps[,kind=V100][,latency=0]``."""
    body = spec[len("hier:"):]
    opts: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PipeplanError(f"cluster {spec!r}: expected key=value, got {item!r}")
        if key not in _HIER_KEYS:
            raise PipeplanError(f"cluster {spec!r}: unknown key {key!r} (allowed: {', '.join(sorted(_HIER_KEYS))})")
        if key in opts:
            raise PipeplanError(f"cluster {spec!r}: {key}= is given twice")
        opts[key] = value
    for req in ("servers", "gpus", "intra"):
        if req not in opts:
            raise PipeplanError(f"cluster {spec!r}: missing {req}=")
    try:
        servers, gpus = int(opts["servers"]), int(opts["gpus"])
    except ValueError:
        raise PipeplanError(f"cluster {spec!r}: servers and gpus must be integers") from None
    if servers > 1 and "inter" not in opts:
        raise PipeplanError(f"cluster {spec!r}: missing inter= (bandwidth between servers)")
    intra = _hier_bandwidth(spec, "intra", opts["intra"], gpus > 1)
    inter = _hier_bandwidth(spec, "inter", opts.get("inter", opts["intra"]), servers > 1)
    speed = None
    if "speed" in opts:
        try:
            speed = float(opts["speed"])
        except ValueError:
            raise PipeplanError(f"cluster {spec!r}: speed must be a number") from None
    return hierarchical(spec, servers, gpus, intra, inter, kind=opts.get("kind", "V100"),
                        latency=parse_time(opts.get("latency", 0), "hier latency"),
                        memory=parse_bytes(opts["memory"], "hier memory") if "memory" in opts else None,
                        speed=speed)
