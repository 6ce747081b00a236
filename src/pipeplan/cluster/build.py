"""Build clusters: hierarchical (servers x GPUs) and from a YAML/JSON description."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import PipeplanError
from ..limits import MAX_DEVICES, check_devices
from ..readers import check_keys, name_field
from ..units import parse_bandwidth, parse_bytes, parse_time
from .kinds import kind as lookup_kind
from .links import ServerLinks
from .model import Cluster, Device, Resource


def hierarchical(name: str, servers: int, gpus: int, intra: float, inter: float,
                 kind: str = "V100", latency: float | tuple[float, float] = 0.0, memory: float | None = None,
                 speed: float | None = None, meta: dict | None = None) -> Cluster:
    """``servers`` x ``gpus`` devices named ``s{i}g{j}``; ``intra`` bandwidth inside a server,
    ``inter`` between servers (bytes/s), the same ``latency`` on every link or (inside,
    between)."""
    if servers < 1 or gpus < 1:
        raise PipeplanError(f"cluster {name!r}: servers and gpus must be >= 1")
    check_devices(servers * gpus, f"cluster {name!r}", by_server=True)
    k = lookup_kind(kind)
    devices = [Device(name=f"s{s}g{g}", kind=k.name, memory=k.memory if memory is None else memory,
                      speed=k.speed if speed is None else speed, server=f"s{s}",
                      resources=k.resources if speed is None else ())
               for s in range(servers) for g in range(gpus)]
    lat = latency if isinstance(latency, tuple) else (latency, latency)
    return Cluster(name, devices, *server_links(servers, gpus, (intra, inter), lat), meta=dict(meta or {}))


def server_links(servers: int, gpus: int, bandwidth: tuple[float, float],
                 latency: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth and latency matrices of ``servers`` x ``gpus`` devices, (inside a server,
    between servers) each: dense up to ``MAX_DEVICES`` devices, held by server beyond."""
    server_of = np.repeat(np.arange(servers), gpus)
    if server_of.size > MAX_DEVICES:
        return (ServerLinks(server_of, *map(float, bandwidth), np.inf),
                ServerLinks(server_of, *map(float, latency), 0.0))
    same = server_of[:, None] == server_of[None, :]
    return np.where(same, *bandwidth).astype(float), np.where(same, *latency).astype(float)


_TOP_KEYS = {"name", "devices", "servers", "bandwidth", "latency", "intra", "inter", "links",
             "allreduce_efficiency", "action_overhead_s", "update_s_per_byte", "duplex", "memory_reserve"}
#: Cluster-wide numbers `pipeplan calibrate` measures (kept through YAML and plan JSON).
CALIBRATED = ("allreduce_efficiency", "action_overhead_s", "update_s_per_byte")
_DEVICE_KEYS = {"name", "kind", "memory", "speed", "server", "resources", "solo_speed"}
_RESOURCE_KEYS = {"name", "fwd_speed", "bwd_speed"}
_SERVER_KEYS = {"name", "gpus", "kind", "memory", "speed", "intra"}
_LINK_KEYS = {"from", "to", "bandwidth", "latency", "directed"}


def _device(d: dict, where: str, server: str = "") -> Device:
    check_keys(d, _DEVICE_KEYS, where)
    if "name" not in d:
        raise PipeplanError(f"{where}: a device needs a 'name'")
    k = lookup_kind(str(d.get("kind", "GPU")))
    speed = d.get("speed", k.speed)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
        raise PipeplanError(f"{where}: speed must be a number > 0, got {speed!r}")
    memory = parse_bytes(d["memory"], f"{where}: memory") if "memory" in d else k.memory
    resources = k.resources if "speed" not in d else ()
    if "resources" in d:
        if not isinstance(d["resources"], list) or not d["resources"]:
            raise PipeplanError(f"{where}: resources must be a non-empty list")
        res = []
        for i, r in enumerate(d["resources"]):
            check_keys(r, _RESOURCE_KEYS, f"{where}: resources[{i}]")
            try:
                res.append(Resource(str(r["name"]), float(r["fwd_speed"]), float(r["bwd_speed"])))
            except (KeyError, TypeError, ValueError):
                raise PipeplanError(f"{where}: resources[{i}] needs name, fwd_speed and bwd_speed (numbers)") from None
        resources = tuple(res)
    solo = d.get("solo_speed")
    if solo is not None and (isinstance(solo, bool) or not isinstance(solo, (int, float)) or not solo > 0):
        raise PipeplanError(f"{where}: solo_speed must be a number > 0, got {solo!r}")
    return Device(name=name_field(d, "name", "", where), kind=k.name, memory=memory, speed=float(speed),
                  server=str(d.get("server", server)), resources=resources,
                  solo_speed=None if solo is None else float(solo))


def cluster_from_dict(d: Any, source: str = "cluster") -> Cluster:
    """Schema (YAML or JSON)::

        name: lab                     # optional
        servers:                      # either servers (shorthand) ...
          - {name: a, gpus: 4, kind: V100, intra: 128Gbps}
        devices:                      # ... or devices, or both
          - {name: gpu0, kind: V100, memory: 32GiB, speed: 1.0, server: a}
        inter: 50Gbps                 # between servers (default: bandwidth)
        bandwidth: 10Gbps             # default for any pair (default: inter/intra, else required)
        latency: 0                    # default latency of every link
        links:                        # overrides, symmetric unless directed: true
          - {from: gpu0, to: gpu1, bandwidth: 128Gbps, latency: 5us}
    """
    d = check_keys(d, _TOP_KEYS, source)
    name = name_field(d, "name", "cluster", source)
    devices: list[Device] = []
    intra_of: dict[str, float] = {}
    for k, s in enumerate(d.get("servers") or []):
        where = f"{source}: servers[{k}]"
        check_keys(s, _SERVER_KEYS, where)
        sname = str(s.get("name", f"s{k}"))
        gpus = s.get("gpus", 1)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise PipeplanError(f"{where}: gpus must be an integer >= 1, got {gpus!r}")
        check_devices(len(devices) + gpus, source)
        if "intra" in s:
            intra_of[sname] = parse_bandwidth(s["intra"], f"{where}: intra")
        for g in range(gpus):
            spec = {key: s[key] for key in ("kind", "memory", "speed") if key in s}
            devices.append(_device({"name": f"{sname}g{g}", **spec}, where, server=sname))
    raw_devices = d.get("devices") or []
    if not isinstance(raw_devices, list):
        raise PipeplanError(f"{source}: 'devices' must be a list")
    check_devices(len(devices) + len(raw_devices), source)
    devices += [_device(x, f"{source}: devices[{k}]") for k, x in enumerate(raw_devices)]
    if not devices:
        raise PipeplanError(f"{source}: no devices (give 'devices' or 'servers')")
    v = len(devices)
    default = d.get("bandwidth")
    inter = parse_bandwidth(d["inter"], f"{source}: inter") if "inter" in d else None
    base = parse_bandwidth(default, f"{source}: bandwidth") if default is not None else inter
    bw = np.full((v, v), np.nan if base is None else base)
    srv = [dev.server for dev in devices]
    for i in range(v):
        for j in range(v):
            if srv[i] and srv[i] == srv[j] and srv[i] in intra_of:
                bw[i, j] = intra_of[srv[i]]
            elif inter is not None and srv[i] != srv[j]:
                bw[i, j] = inter
    lat = np.full((v, v), parse_time(d.get("latency", 0), f"{source}: latency"))
    index = {dev.name: i for i, dev in enumerate(devices)}
    for k, link in enumerate(d.get("links") or []):
        where = f"{source}: links[{k}]"
        check_keys(link, _LINK_KEYS, where)
        try:
            a, b = index[str(link["from"])], index[str(link["to"])]
        except KeyError as e:
            raise PipeplanError(f"{where}: unknown device {e.args[0]!r}") from None
        pairs = [(a, b)] if link.get("directed") else [(a, b), (b, a)]
        for i, j in pairs:
            if "bandwidth" in link:
                bw[i, j] = parse_bandwidth(link["bandwidth"], f"{where}: bandwidth")
            if "latency" in link:
                lat[i, j] = parse_time(link["latency"], f"{where}: latency")
    np.fill_diagonal(bw, np.inf)
    meta = _cluster_meta(d, source)
    if np.isnan(bw).any():
        i, j = map(int, np.argwhere(np.isnan(bw))[0])
        raise PipeplanError(f"{source}: no bandwidth for {devices[i].name} -> {devices[j].name} "
                            "(set 'bandwidth', 'inter' or a link)")
    return Cluster(name, devices, bw, lat, meta=meta)


def _cluster_meta(d: dict, source: str) -> dict:
    """The calibrated and optional cluster-wide fields: all-reduce efficiency, per-action
    overhead, optimizer step (seconds per parameter byte), duplex."""
    meta = {}
    if "allreduce_efficiency" in d:
        eff = d["allreduce_efficiency"]
        if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
            raise PipeplanError(f"{source}: allreduce_efficiency must be in (0, 1], got {eff!r}")
        meta["allreduce_efficiency"] = float(eff)
    for key in ("action_overhead_s", "update_s_per_byte"):
        if key in d:
            meta[key] = parse_time(d[key], f"{source}: {key}")
    if "memory_reserve" in d:
        meta["memory_reserve"] = parse_bytes(d["memory_reserve"], f"{source}: memory_reserve")
    if "duplex" in d:
        if d["duplex"] not in ("full", "half"):
            raise PipeplanError(f"{source}: duplex must be 'full' or 'half', got {d['duplex']!r}")
        meta["duplex"] = d["duplex"]
    return meta


def _server_starts(c: Cluster) -> np.ndarray | None:
    """First device of each server when every server's devices are contiguous, else None."""
    names = [d.server for d in c.devices]
    starts = [0] + [i for i in range(1, len(names)) if names[i] != names[i - 1]]
    return np.asarray(starts) if len({names[i] for i in starts}) == len(starts) else None


def _blocks(m: np.ndarray, starts: np.ndarray) -> np.ndarray | None:
    """The server x server matrix of ``m``'s values between distinct devices, when each block
    holds one value (0 for a block with none: one device's server with itself), else None."""
    lo, hi = m.copy(), m.copy()
    np.fill_diagonal(lo, np.inf)
    np.fill_diagonal(hi, -np.inf)
    bmin = np.minimum.reduceat(np.minimum.reduceat(lo, starts, axis=0), starts, axis=1)
    bmax = np.maximum.reduceat(np.maximum.reduceat(hi, starts, axis=0), starts, axis=1)
    empty = np.isinf(bmin) & (bmin > 0) & np.isinf(bmax) & (bmax < 0)
    if not np.all(empty | (bmin == bmax)):
        return None
    return np.where(empty, 0.0, bmin)


def _links_to_dict(c: Cluster, bw: np.ndarray) -> dict:
    """Links per pair of servers when they are uniform inside every pair of servers (large
    ``hier:`` clusters: O(servers^2) numbers, not O(devices^2)), else full matrices."""
    starts = _server_starts(c)
    diag_bw, diag_lat = np.diag(bw), np.diag(c.latency)
    if starts is not None and len(starts) < len(c) and np.all(diag_bw == diag_bw[0]) \
            and np.all(diag_lat == diag_lat[0]):
        bb, lb = _blocks(bw, starts), _blocks(c.latency, starts)
        if bb is not None and lb is not None:
            return {"server_links": {"bandwidth": bb.tolist(), "latency": lb.tolist(),
                                     "self_bandwidth": float(diag_bw[0]), "self_latency": float(diag_lat[0])}}
    return {"bandwidth_matrix": bw.tolist(), "latency_matrix": c.latency.tolist()}


def _links_by_server(d: dict, devices: list[Device]) -> tuple[np.ndarray, np.ndarray]:
    """``links_by_server``: (inside a server, between servers) for bandwidth and latency."""
    s = check_keys(d["links_by_server"], {"bandwidth", "latency"}, "links_by_server")
    pairs = []
    for key in ("bandwidth", "latency"):
        v = s.get(key)
        if not isinstance(v, list) or len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                         for x in v):
            raise PipeplanError(f"links_by_server: {key} must be [inside a server, between servers], got {v!r}")
        pairs.append((float(v[0]), float(v[1])))
    check_devices(len(devices), "links_by_server", by_server=True)
    rank = {name: i for i, name in enumerate(dict.fromkeys(x.server for x in devices))}
    server_of = np.array([rank[x.server] for x in devices])
    if len(devices) > MAX_DEVICES:
        return ServerLinks(server_of, *pairs[0], np.inf), ServerLinks(server_of, *pairs[1], 0.0)
    same = server_of[:, None] == server_of[None, :]
    return np.where(same, *pairs[0]), np.where(same, *pairs[1])


def _links_from_dict(d: dict, devices: list[Device]) -> tuple[np.ndarray, np.ndarray]:
    if "links_by_server" in d:
        return _links_by_server(d, devices)
    check_devices(len(devices), "cluster")
    if "server_links" not in d:
        return np.array(d["bandwidth_matrix"], dtype=float), np.array(d["latency_matrix"], dtype=float)
    s = check_keys(d["server_links"], {"bandwidth", "latency", "self_bandwidth", "self_latency"}, "server_links")
    rank = {name: i for i, name in enumerate(dict.fromkeys(x.server for x in devices))}
    idx = np.array([rank[x.server] for x in devices])
    out = []
    for key in ("bandwidth", "latency"):
        own = float(s[f"self_{key}"])
        if math.isnan(own) or own < 0:
            raise PipeplanError(f"server_links: self_{key} is {'not a number' if math.isnan(own) else 'negative'}")
        m = np.array(s[key], dtype=float)
        if m.shape != (len(rank), len(rank)):
            raise PipeplanError(f"server_links: {key} is {m.shape}, expected {(len(rank), len(rank))} (one per "
                                "pair of servers)")
        m = m[np.ix_(idx, idx)]
        np.fill_diagonal(m, float(s[f"self_{key}"]))
        out.append(m)
    return out[0], out[1]


def cluster_to_dict(c: Cluster) -> dict:
    """Self-contained form (used inside plan JSON): explicit devices and the links, as full
    matrices or, when uniform between every pair of servers, per pair of servers; a cluster
    held by server (``links.ServerLinks``) as its two numbers each (``links_by_server``)."""
    if isinstance(c.bandwidth, ServerLinks):
        links = {"links_by_server": {"bandwidth": [c.bandwidth.inside, c.bandwidth.between],
                                     "latency": [c.latency.inside, c.latency.between]}}
    else:
        links = _links_to_dict(c, np.where(np.isinf(c.bandwidth), 0.0, c.bandwidth))
    return {"name": c.name,
            "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory, "speed": d.speed,
                         "server": d.server,
                         **({"resources": [{"name": r.name, "fwd_speed": r.fwd_speed, "bwd_speed": r.bwd_speed}
                                           for r in d.resources]} if d.resources else {}),
                         **({"solo_speed": d.solo_speed} if d.solo_speed else {})}
                        for d in c.devices],
            **{k: c.meta[k] for k in (*CALIBRATED, "duplex", "memory_reserve") if k in c.meta}, **links}


_FULL_KEYS = {"name", "devices", "bandwidth_matrix", "latency_matrix", "server_links", "links_by_server",
              *CALIBRATED, "duplex", "memory_reserve"}


def cluster_from_full_dict(d: Any, source: str = "plan: cluster") -> Cluster:
    """Inverse of :func:`cluster_to_dict`."""
    check_keys(d, _FULL_KEYS, source)
    if not isinstance(d.get("devices"), list):
        raise PipeplanError(f"{source}: 'devices' must be a list")
    for k, x in enumerate(d["devices"]):
        check_keys(x, _DEVICE_KEYS, f"{source}: devices[{k}]")
    try:
        devices = [Device(name=name_field(x, "name", "", source), kind=str(x.get("kind", "GPU")),
                          memory=float(x["memory"]),
                          speed=float(x["speed"]), server=str(x.get("server", "")),
                          resources=tuple(Resource(str(r["name"]), float(r["fwd_speed"]), float(r["bwd_speed"]))
                                          for r in x.get("resources", [])),
                          solo_speed=None if x.get("solo_speed") is None else float(x["solo_speed"]))
                   for x in d["devices"]]
        if not devices:
            raise PipeplanError("no devices")
        bw, lat = _links_from_dict(d, devices)
        meta = {k: float(d[k]) for k in CALIBRATED if k in d}
        if d.get("duplex") in ("full", "half"):
            meta["duplex"] = d["duplex"]
        if "memory_reserve" in d:
            meta["memory_reserve"] = parse_bytes(d["memory_reserve"], "memory_reserve")
        return Cluster(name_field(d, "name", "cluster", source), devices, bw, lat, meta=meta)
    except PipeplanError as e:
        raise PipeplanError(f"{source}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise PipeplanError(f"{source}: malformed cluster ({e.__class__.__name__}: {e})") from None
