"""What a learning planner weighs beside its own samples, so that its answer is never worse
than the trivial plans nor than the best plan its training found:

- ``trivial_candidates``: data parallelism (one stage, every device) and equal-compute splits
  (the topological order cut into K stages of about equal forward + backward time, the
  devices in order into K equal groups) for each K that divides the devices, up to
  ``MAX_SPLIT``;
- ``record``/``recorded``: the best plan a training scored, kept in its checkpoint with its
  iteration time and the instance it was scored on (a digest of the graph, the cluster and
  the microbatches), returned by ``plan -O checkpoint=`` on that instance, scored again on
  the current simulator.

A candidate is ``(part, device_part)`` as ``scoring.Scorer`` takes it.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..plan import Plan

#: the most stages of an equal-compute split weighed
MAX_SPLIT = 8


def trivial_candidates(graph: Graph, devices: int, stages: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(parts (C, nodes), device parts (C, devices)): data parallelism first, then each
    equal-compute split (module docstring; ``stages``: only into these many stages)."""
    order = np.asarray(graph.topo, dtype=np.int64)
    work = np.cumsum((graph.fwd + graph.bwd)[order])
    parts, device_parts = [np.zeros(len(graph), dtype=np.int64)], [np.zeros(devices, dtype=np.int64)]
    for k in range(2, min(MAX_SPLIT, devices, len(graph)) + 1):
        if devices % k or (stages is not None and k not in stages):
            continue
        cuts = np.searchsorted(work, work[-1] * np.arange(1, k) / k, side="left") + 1  # nodes before each cut
        cuts = np.maximum(cuts, np.arange(1, k))  # every stage at least one node
        cuts = np.minimum(cuts, len(graph) - np.arange(k - 1, 0, -1))
        if np.any(np.diff(cuts) < 1):
            continue
        part = np.empty(len(graph), dtype=np.int64)
        part[order] = np.searchsorted(cuts, np.arange(len(graph)), side="right")
        parts.append(part)
        device_parts.append(np.repeat(np.arange(k), devices // k))
    return np.stack(parts), np.stack(device_parts)


def trivial_under(graph: Graph, devices: int, executions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``trivial_candidates`` each under every one of ``executions`` executions: (parts,
    device parts, execution indices), as ``scoring.Scorer.score`` takes them."""
    parts, devs = trivial_candidates(graph, devices)
    return (np.repeat(parts, executions, axis=0), np.repeat(devs, executions, axis=0),
            np.tile(np.arange(executions), len(parts)))


def instance_key(graph: Graph, cluster: Cluster, microbatches: int) -> str:
    """A digest of what a plan's score depends on besides the simulator: the graph's nodes,
    costs and edges, the cluster's devices and links, the microbatches."""
    h = hashlib.sha256()
    h.update("\0".join(graph.ids).encode())
    for arr in (graph.fwd, graph.bwd, graph.params, graph.act, np.asarray(graph.edges, dtype=np.int64),
                cluster.speed, cluster.memory, cluster.bandwidth, cluster.latency):
        h.update(np.ascontiguousarray(arr, dtype=np.float64 if arr.dtype.kind == "f" else arr.dtype).tobytes())
    h.update("\0".join(cluster.names).encode() + str(int(microbatches)).encode())
    return h.hexdigest()


def record(key: str, part: np.ndarray, device_part: np.ndarray, execution: tuple[str, str],
           iteration_s: float) -> dict:
    """The checkpoint's record of the best plan found (plain lists: a checkpoint loads with
    ``weights_only``)."""
    return {"instance": key, "part": [int(x) for x in part], "device_part": [int(x) for x in device_part],
            "execution": list(execution), "iteration_s": float(iteration_s)}


def recorded(trained_on: dict, key: str, nodes: int, devices: int,
             executions: tuple[tuple[str, str], ...], path: str) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The best plan a checkpoint records, as (part, device part, execution index), when it
    was found on this instance under an execution this run allows; None otherwise (another
    model or cluster: its agent plans by sampling). A malformed record is one line."""
    rec = trained_on.get("best")
    if rec is None or not isinstance(rec, dict) or rec.get("instance") != key:
        if rec is not None and not isinstance(rec, dict):
            raise PipeplanError(f"checkpoint {path!r}: its trained_on 'best' is a {type(rec).__name__}, not a mapping")
        return None
    part, dev, ex = rec.get("part"), rec.get("device_part"), rec.get("execution")
    ok = (isinstance(part, list) and len(part) == nodes and isinstance(dev, list) and len(dev) == devices
          and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < nodes for x in part + dev)
          and isinstance(ex, list) and len(ex) == 2 and all(isinstance(x, str) for x in ex))
    if not ok:
        raise PipeplanError(f"checkpoint {path!r}: its trained_on 'best' is not a plan of this instance ({nodes} "
                            f"nodes, {devices} devices)")
    if tuple(ex) not in executions:
        return None
    return np.asarray(part, dtype=np.int64), np.asarray(dev, dtype=np.int64), executions.index(tuple(ex))


def no_worse_than_trivial(plan: Plan, microbatches: int, schedule: str, optimizer: str) -> tuple[Plan, str | None]:
    """``plan`` (stages with split replicas), or the trivial plan that scores better on the
    batched evaluator (``scoring.Scorer``: the same reward, memory penalty included), its
    replicas splitting each microbatch or taking whole ones in turn (``dp``'s two modes), and
    which trivial plan won (None: ``plan``). The splits weighed: into as many stages as
    ``plan`` has (a millisecond planner affords one more stage count)."""
    from .scoring import Scorer

    graph, cluster = plan.graph, plan.cluster
    parts, devs = trivial_candidates(graph, len(cluster), (len(plan.stages),))
    own_dev = np.full(len(cluster), -1, dtype=np.int64)
    for k, devices in enumerate(plan.stage_devices()):
        own_dev[devices] = k
    if (own_dev < 0).any():  # a plan leaving devices idle: compared as it is against the rest
        own_dev[own_dev < 0] = int(own_dev.max())
    scorer = Scorer(graph, cluster, microbatches, schedule, "split", optimizer,
                    ((schedule, "split"), (schedule, "round-robin")))
    n = len(parts)
    res = scorer.score(np.vstack([plan.stage_of_node()[None], parts, parts]), np.vstack([own_dev[None], devs, devs]),
                       np.repeat([0, 0, 1], [1, n, n]))
    i = int(np.argmax(res.reward))
    if i == 0 or res.reward[i] <= res.reward[0]:
        return plan, None
    j, mode = (i - 1) % n, (i - 1) // n
    better = scorer.plan(parts[j], devs[j], mode)
    better.planner = plan.planner
    return better, trivial_name(parts[j], scorer.executions[mode])


def trivial_name(part: np.ndarray, execution: tuple[str, str]) -> str:
    """How a report names a trivial plan: "data parallelism (split)", "equal-compute split
    into 2 stages (1f1b, round-robin)" (the schedule said where stages make it matter)."""
    k = int(part.max()) + 1
    if k == 1:
        return f"data parallelism ({execution[1]})"
    return f"equal-compute split into {k} stages ({execution[0]}, {execution[1]})"
