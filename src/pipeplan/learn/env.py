"""Gymnasium environments over the learning planners' action space: one episode builds one
plan for a (graph, cluster) pair.

The episode is DRL-PP's recurrent DAG partition (Algorithm 1, §3.2) followed by the placement
of the partitions on the devices (§3.3), step by step through :class:`PartitionState`: pick
a partition's first node, add candidates, cut; then each device in index order takes a
partition. DRL-PP lets its scheduler leave a partition without a device and penalizes that
(§3.3); here, as in ``PartitionState``, such picks are masked, so every episode that follows
``action_mask`` ends in a runnable plan.

Actions are padded so that one agent can read graphs and clusters of different sizes:
``Discrete(max_nodes + 1 + max_devices)``, ``0 .. max_nodes - 1`` a node (only the first
``len(graph)`` exist), ``max_nodes`` cut, ``max_nodes + 1 + p`` give the next device partition
p. The observation (``PartitionEnv.observation_space``, a ``spaces.Dict``):

* ``node_features`` (max_nodes, NODE_FEATURES) float32 and ``adjacency`` (max_nodes,
  max_nodes) float32: DRL-PP's encoder input (§3.1, ``features.py``), zero where padded;
  ``node_mask`` (max_nodes,) int8: 1 for the graph's nodes.
* ``device_features`` (max_devices, DEVICE_FEATURES) float32 and ``device_mask``.
* ``node_partition`` (max_nodes,) int64: the partition of each node so far, -1 for none yet
  (and for padding); ``device_partition`` (max_devices,) int64: the partition each device
  holds, -1 for none yet.
* ``phase``: 0 partitioning, 1 placing, 2 episode over; ``partition``: while partitioning the
  partition being built, afterwards the number of partitions; ``starting``: 1 when the next
  action picks a new partition's first node; ``device``: the next device to place.
* ``action_mask`` (max_nodes + 1 + max_devices,) int8: the valid actions now (all 0 once the
  episode is over); ``action_masks()`` returns it as bool (sb3-contrib's MaskablePPO).

Reward (§3.4, Eq. 2): 0 until the last step, then the scorer's reward for the finished plan,
``-ln(iteration time)`` less the scorer's penalties (``scoring.py``); the last step's ``info``
holds ``iteration_s``, ``fits``, ``part`` (node -> partition), ``device_part`` (device ->
partition) and ``num_partitions``. DRL-PP scores plans in "a real-world environment" (§3.4)
because profiles and cost models err (§2.2): :class:`MeasuredPartitionEnv` scores each
finished plan with a runner handed in (``runtime.measure.plan_runner``: the plan trained for
real on the runtime's worker processes; :class:`RuntimeScorer`, each distinct plan measured
once); :class:`PartitionEnv` scores it
with the simulator (fast, for training on large models).

Invalid actions: by default (``invalid_action="end"``) an action outside ``action_mask``
ends the episode with the scorer's infeasible reward and ``info["invalid_action"]`` set to
the action, the state unchanged. Gymnasium's ``check_env`` steps with unmasked random
actions, so this is the mode it accepts; ``invalid_action="raise"`` raises ValueError
instead (for debugging an agent). Stepping after the episode is over raises RuntimeError.
The environments draw no random numbers: given the actions, an episode is deterministic
(``reset(seed=...)`` still seeds ``np_random`` for wrappers and agents).

Registered on import as ``pipeplan/Partition-v0`` and ``pipeplan/MeasuredPartition-v0``
(``gymnasium.make("pipeplan.learn.env:pipeplan/Partition-v0", graph=..., cluster=...,
microbatches=...)`` imports this module first). The runtime's runner spawns processes:
scripts that use it need the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Protocol

import gymnasium
import numpy as np
from gymnasium import spaces

from ..cluster import Cluster
from ..graph import Graph
from ..plan import Plan
from .features import DEVICE_FEATURES, NODE_FEATURES, adjacency, device_features, node_features
from .partition import Ancestors, PartitionState
from .scoring import Execution, Scorer, Scores

PARTITIONING, PLACING, OVER = 0, 1, 2
INVALID_ACTION_MODES = ("end", "raise")


class PlanScorer(Protocol):
    """What an environment needs of a scorer (``Scorer`` and ``RuntimeScorer`` are ones)."""

    evaluations: int

    @property
    def infeasible_reward(self) -> float: ...

    def score(self, part: np.ndarray, device_part: np.ndarray, execution: np.ndarray | None = None) -> Scores: ...

    def plan(self, part: np.ndarray, device_part: np.ndarray, execution: int = 0) -> Plan: ...


def _padded(values: np.ndarray, rows: int, cols: int | None = None, fill: float = 0) -> np.ndarray:
    """``values`` in the top-left corner of a (rows[, cols]) array of ``fill``."""
    shape = (rows,) + values.shape[1:] if cols is None else (rows, cols)
    out = np.full(shape, fill, dtype=values.dtype)
    out[tuple(slice(0, s) for s in values.shape)] = values
    return out


class PartitionEnv(gymnasium.Env):
    """One episode builds one plan of ``graph`` on ``cluster`` (module docstring).

    ``microbatches``, ``schedule``, ``replicas`` and ``optimizer`` configure the default
    scorer, ``Scorer(graph, cluster, ...)``; a ``scorer`` given instead must score plans of
    this graph and cluster (e.g. a :class:`RuntimeScorer`). ``max_nodes`` / ``max_devices``
    pad the observation and action spaces (default: the graph's / cluster's size)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, graph: Graph, cluster: Cluster, microbatches: int, schedule: str = "1f1b",
                 replicas: str = "round-robin", optimizer: str = "adam", max_nodes: int | None = None,
                 max_devices: int | None = None, scorer: PlanScorer | None = None,
                 invalid_action: str = "end") -> None:
        super().__init__()
        self.graph, self.cluster = graph, cluster
        self.nodes, self.devices = len(graph), len(cluster)
        self.max_nodes = self.nodes if max_nodes is None else int(max_nodes)
        self.max_devices = self.devices if max_devices is None else int(max_devices)
        if self.max_nodes < self.nodes or self.max_devices < self.devices:
            raise ValueError(f"max_nodes={self.max_nodes} / max_devices={self.max_devices} are smaller than the "
                             f"graph ({self.nodes} nodes) / cluster ({self.devices} devices)")
        if invalid_action not in INVALID_ACTION_MODES:
            raise ValueError(f"invalid_action must be one of {INVALID_ACTION_MODES}, got {invalid_action!r}")
        self.invalid_action = invalid_action
        self.scorer: PlanScorer = scorer if scorer is not None else Scorer(
            graph, cluster, microbatches, schedule, replicas, optimizer)
        self.ancestors = Ancestors(graph)
        self._static = {
            "node_features": _padded(node_features(graph), self.max_nodes),
            "adjacency": _padded(adjacency(graph), self.max_nodes, self.max_nodes),
            "node_mask": _padded(np.ones(self.nodes, dtype=np.int8), self.max_nodes),
            "device_features": _padded(device_features(cluster), self.max_devices),
            "device_mask": _padded(np.ones(self.devices, dtype=np.int8), self.max_devices),
        }
        self.action_space = spaces.Discrete(self.max_nodes + 1 + self.max_devices)
        self.observation_space = self._observation_space()
        self.state = PartitionState(graph, self.devices, self.ancestors)
        self._over = False

    def _observation_space(self) -> spaces.Dict:
        n, d = self.max_nodes, self.max_devices
        return spaces.Dict({
            "node_features": spaces.Box(0.0, 1.0, (n, NODE_FEATURES), np.float32),
            "adjacency": spaces.Box(0.0, 1.0, (n, n), np.float32),
            "node_mask": spaces.MultiBinary(n),
            "device_features": spaces.Box(0.0, 1.0, (d, DEVICE_FEATURES), np.float32),
            "device_mask": spaces.MultiBinary(d),
            "node_partition": spaces.Box(-1, d - 1, (n,), np.int64),
            "device_partition": spaces.Box(-1, d - 1, (d,), np.int64),
            "phase": spaces.Discrete(3),
            "partition": spaces.Discrete(d + 1),
            "starting": spaces.Discrete(2),
            "device": spaces.Discrete(d + 1),
            "action_mask": spaces.MultiBinary(n + 1 + d),
        })

    # -- actions -----------------------------------------------------------------------
    def state_action(self, action: int) -> int | None:
        """The ``PartitionState`` action of a padded action (None: a padding slot)."""
        if 0 <= action < self.nodes:
            return action
        if action == self.max_nodes:
            return self.nodes
        p = action - self.max_nodes - 1
        return self.nodes + 1 + p if 0 <= p < self.devices else None

    def padded_action(self, action: int) -> int:
        """The padded action of a ``PartitionState`` action."""
        return action if action < self.nodes else self.max_nodes + (action - self.nodes)

    def action_masks(self) -> np.ndarray:
        """Valid padded actions now, bool (all False once the episode is over)."""
        m = np.zeros(self.action_space.n, dtype=bool)
        if self._over:
            return m
        s = self.state.mask()
        m[:self.nodes] = s[:self.nodes]
        m[self.max_nodes] = s[self.nodes]
        m[self.max_nodes + 1:self.max_nodes + 1 + self.devices] = s[self.nodes + 1:]
        return m

    # -- gymnasium API -----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.state = PartitionState(self.graph, self.devices, self.ancestors)
        self._over = False
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._over:
            raise RuntimeError("the episode is over: call reset() before step()")
        a = self._index(action)
        if a is None or not self.action_masks()[a]:
            if self.invalid_action == "raise":
                raise ValueError(f"action {action!r} is not valid now (phase {self._phase()}; valid: "
                                 f"{np.flatnonzero(self.action_masks()).tolist()})")
            self._over = True
            info = {**self._plan_info(), "invalid_action": action if a is None else a,
                    "iteration_s": math.inf, "fits": False}
            return self._obs(), float(self.scorer.infeasible_reward), True, False, info
        self.state.step(self.state_action(a))
        if not self.state.done:
            return self._obs(), 0.0, False, False, {}
        self._over = True
        res = self.scorer.score(self.state.part[None, :], self.state.device_part[None, :])
        info = {**self._plan_info(), "iteration_s": float(res.iteration_s[0]), "fits": bool(res.fits[0])}
        return self._obs(), float(res.reward[0]), True, False, info

    def plan(self) -> Plan:
        """The Plan the finished episode built."""
        if not self.state.done:
            raise RuntimeError("the episode has not built a plan yet")
        return self.scorer.plan(self.state.part, self.state.device_part)

    # -- helpers -----------------------------------------------------------------------
    def _index(self, action: Any) -> int | None:
        """``action`` as an index into the action space (None: not an integer in range)."""
        try:
            a = operator.index(np.asarray(action).item())
        except (TypeError, ValueError):
            return None
        return a if 0 <= a < self.action_space.n else None

    def _phase(self) -> int:
        if self._over or self.state.done:
            return OVER
        return PARTITIONING if self.state.partitioning else PLACING

    def _plan_info(self) -> dict[str, Any]:
        st = self.state
        return {"part": st.part.copy(), "device_part": st.device_part.copy(), "num_partitions": st.num_partitions}

    def _obs(self) -> dict[str, Any]:
        st = self.state
        obs = {k: v.copy() for k, v in self._static.items()}
        obs["node_partition"] = _padded(st.part, self.max_nodes, fill=-1)
        obs["device_partition"] = _padded(st.device_part, self.max_devices, fill=-1)
        obs["phase"] = np.int64(self._phase())
        obs["partition"] = np.int64(st.k if st.partitioning else st.num_partitions)
        obs["starting"] = np.int64(st.partitioning and st.starting)
        obs["device"] = np.int64(st.next_device)
        obs["action_mask"] = self.action_masks().astype(np.int8)
        return {k: obs[k] for k in self.observation_space.spaces}


# -- measured on the runtime (§2.2, §3.4) ---------------------------------------------------

def plan_key(plan: Plan) -> tuple:
    """A plan's identity for the measurement cache: its schedule and replica mode, each
    stage's node set and device set."""
    return (plan.schedule, plan.replicas, *((frozenset(s.nodes), frozenset(s.devices)) for s in plan.stages))


class RuntimeScorer:
    """Scores candidates by running them: ``runner(plan)`` -> measured seconds per iteration
    (``runtime.measure.plan_runner`` trains the plan for real on one worker process per
    device; handed in, so that learn/ never imports the runtime); reward ``-ln(measured
    seconds per iteration)`` (DRL-PP Eq. 2). Each distinct plan (``plan_key``) is measured
    once and cached. A candidate the cost model calls unrunnable or over memory is not run: it
    gets ``infeasible_reward``, iteration time inf and ``fits`` False. Runner failures
    propagate. ``evaluations``: candidates scored; ``measured``: runs made."""

    def __init__(self, graph: Graph, cluster: Cluster, microbatches: int, runner: Callable[[Plan], float],
                 schedule: str = "1f1b", replicas: str = "round-robin", optimizer: str = "adam",
                 executions: tuple[Execution, ...] | None = None) -> None:
        self.graph, self.cluster = graph, cluster
        # plans, feasibility, memory
        self.model = Scorer(graph, cluster, microbatches, schedule, replicas, optimizer, executions)
        self.executions = self.model.executions
        self.runner = runner
        self.cache: dict[tuple, float] = {}
        self.evaluations = 0
        self.measured = 0

    @property
    def infeasible_reward(self) -> float:
        return self.model.infeasible_reward

    def plan(self, part: np.ndarray, device_part: np.ndarray, execution: int = 0) -> Plan:
        """The Plan of one candidate."""
        return self.model.plan(part, device_part, execution)

    def measure(self, plan: Plan) -> float:
        """Measured seconds per iteration of ``plan`` (cached per ``plan_key``)."""
        key = plan_key(plan)
        if key not in self.cache:
            seconds = float(self.runner(plan))
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError(f"the runtime measured {seconds!r} s per iteration")
            self.cache[key] = seconds
            self.measured += 1
        return self.cache[key]

    def score(self, part: np.ndarray, device_part: np.ndarray, execution: np.ndarray | None = None) -> Scores:
        """Scores of candidates ``part`` (B, nodes) and ``device_part`` (B, devices), under
        ``executions[execution[b]]`` (the first when None)."""
        part, device_part = np.atleast_2d(part), np.atleast_2d(device_part)
        ex = np.zeros(len(part), dtype=np.int64) if execution is None else np.asarray(execution)
        predicted = self.model.score(part, device_part, ex)
        iteration = np.full(len(part), np.inf)
        reward = np.full(len(part), self.infeasible_reward)
        for b in np.flatnonzero(predicted.fits):
            iteration[b] = self.measure(self.plan(part[b], device_part[b], int(ex[b])))
            reward[b] = -math.log(iteration[b])
        self.evaluations += len(part)
        return Scores(iteration, predicted.fits.copy(), reward)


class MeasuredPartitionEnv(PartitionEnv):
    """:class:`PartitionEnv` whose finished plans are measured (:class:`RuntimeScorer` over
    ``runner``, or ``scorer`` as given). ``graph``: the profile of the model the runner runs
    (node ids = its layers)."""

    def __init__(self, graph: Graph | None, cluster: Cluster, microbatches: int,
                 runner: Callable[[Plan], float] | None = None, schedule: str = "1f1b",
                 replicas: str = "round-robin", optimizer: str = "adam", max_nodes: int | None = None,
                 max_devices: int | None = None, scorer: RuntimeScorer | None = None,
                 invalid_action: str = "end") -> None:
        if scorer is None:
            if graph is None or runner is None:
                raise ValueError("MeasuredPartitionEnv needs graph and runner, or a scorer")
            scorer = RuntimeScorer(graph, cluster, microbatches, runner, schedule, replicas, optimizer)
        super().__init__(scorer.graph, cluster, microbatches, schedule, replicas, optimizer, max_nodes, max_devices,
                         scorer, invalid_action)


ENV_IDS = {"pipeplan/Partition-v0": ("pipeplan.learn.env:PartitionEnv", False),
           "pipeplan/MeasuredPartition-v0": ("pipeplan.learn.env:MeasuredPartitionEnv", True)}


def register_envs() -> None:
    """Register the environments with gymnasium (once; importing this module does it)."""
    for env_id, (entry_point, nondeterministic) in ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, nondeterministic=nondeterministic)


register_envs()
