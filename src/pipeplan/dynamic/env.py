"""DynPartition's SCHEDULERENV (dynpartition.txt §6.1): a gymnasium environment whose episode
is one step: ``reset`` draws an input tree, the action places every node of it on a device,
and the reward is minus the forward pass's time in milliseconds.

Observation (§4.1): the tree is listed in in-order traversal and node k of that list (its
*in-order position*) is described by four integers,

    (k + 1, depth, in-order position of its parent + 1 (0 for the root), is_leaf)

each looked up in a sinusoidal position table (``POSITIONS``: row p, even dims
``sin(p * 10000^(-2i/32))``, odd dims ``cos(...)``, as in Vaswani et al. 2017) and the four
rows averaged: a (``MAX_NODES``, ``EMBED_DIM``) = (128, 32) float32 matrix whose row k is
in-order node k; rows beyond the tree are zero. The original program (fanpu/DynPartition)
stored the node's own position as its "parent"; we store the parent's. The table has
``MAX_NODES + 1`` rows because the 128th node's position is 128.

Action: ``MultiDiscrete([D] * 128)``; entry k is the device of in-order node k, i.e. of node
``tree.inorder[k]`` (``placement_of`` maps an action to a placement in node order,
``action_of`` back). Entries beyond the tree are ignored (``info["mask"]`` marks the real
rows). Device 0 is the CPU (the normalized reward's reference).

Reward, from one of two sources:

* ``measure=Executor(...)``: the forward pass is run for real, ``Executor.time(tree,
  placement, repeats)`` (§6.1: "averaged over 10 runs");
* ``simulate=Machine(...)``: ``sim.formulas.simulate`` on the tree's profile (profiles cached
  per tree): deterministic, ~0.1 ms a step.

``-ms`` by default; with ``normalized=True`` the §9.3 suggestion, ``-(time / time of the
same tree all on device 0)`` (the all-CPU time is computed once per tree and cached; under
``measure`` it is one measurement, so an all-CPU placement scores about, not exactly, -1).

Trees above ``MAX_NODES`` nodes are dropped (§6.1). ``info`` of ``reset``: ``mask``,
``tree`` (index into ``env.trees``), ``nodes``; of ``step``: also ``ms``, ``placement``
(node order) and, when normalized, ``cpu_ms``. ``reset(options={"tree": i})`` picks a tree.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from ..errors import PipeplanError
from . import simulator
from .simulator import Machine
from .executor import Executor
from .nets import build_net
from .trees import Tree, sample_trees

#: §6.1: "in practice we set this to 128 nodes"
MAX_NODES = 128
#: the positional embedding's width (the original's)
EMBED_DIM = 32
#: node features looked up in ``POSITIONS``: in-order position + 1, depth, parent's position + 1, is_leaf
FEATURES = 4


def sinusoid_table(rows: int = MAX_NODES + 1, dim: int = EMBED_DIM) -> np.ndarray:
    """Transformer-style sinusoidal positions: row p, dim 2i = sin(p w_i), 2i+1 = cos(p w_i),
    w_i = 10000^(-2i/dim)."""
    p = np.arange(rows, dtype=np.float64)[:, None]
    w = np.exp(-math.log(10000.0) * np.arange(0, dim, 2, dtype=np.float64) / dim)
    out = np.zeros((rows, dim))
    out[:, 0::2] = np.sin(p * w)
    out[:, 1::2] = np.cos(p * w)
    return out


POSITIONS = sinusoid_table()


def inorder_position(tree: Tree) -> np.ndarray:
    """Each node's (post-order index's) position in the in-order traversal."""
    pos = np.empty(tree.n, dtype=np.int64)
    pos[list(tree.inorder)] = np.arange(tree.n)
    return pos


def features(tree: Tree) -> np.ndarray:
    """(n, 4) int64, row k for in-order node k: position + 1, depth, parent's position + 1
    (0 for the root), is_leaf (module docstring)."""
    if tree.n > MAX_NODES:
        raise PipeplanError(f"a tree of {tree.n} nodes is above the {MAX_NODES} an observation holds (§6.1)")
    order = np.asarray(tree.inorder, dtype=np.int64)
    pos = inorder_position(tree)
    parent = tree.parent[order]
    out = np.empty((tree.n, FEATURES), dtype=np.int64)
    out[:, 0] = np.arange(1, tree.n + 1)
    out[:, 1] = tree.depth[order]
    out[:, 2] = np.where(parent >= 0, pos[np.maximum(parent, 0)] + 1, 0)
    out[:, 3] = [0 if tree.children[i] else 1 for i in order]
    return out


def encode(tree: Tree) -> np.ndarray:
    """The (128, 32) float32 observation of ``tree``: the mean of its four features'
    sinusoid rows per in-order node, zero rows after the tree."""
    out = np.zeros((MAX_NODES, EMBED_DIM), dtype=np.float32)
    out[:tree.n] = POSITIONS[features(tree)].mean(axis=1)
    return out


def node_mask(tree: Tree) -> np.ndarray:
    """(128,) bool: True for the rows (in-order positions) that hold a node."""
    m = np.zeros(MAX_NODES, dtype=bool)
    m[:tree.n] = True
    return m


def placement_of(tree: Tree, action) -> list[int]:
    """Node order placement of an action (entry k: in-order node k's device; entries beyond
    the tree ignored)."""
    a = np.asarray(action).reshape(-1)
    if a.shape[0] < tree.n:
        raise PipeplanError(f"an action of {a.shape[0]} entries cannot place a tree of {tree.n} nodes")
    return [int(x) for x in a[inorder_position(tree)]]


def action_of(tree: Tree, placement) -> np.ndarray:
    """The (128,) int64 action placing node i on ``placement[i]`` (padding 0)."""
    place = np.asarray(placement, dtype=np.int64)
    if place.shape != (tree.n,):
        raise PipeplanError(f"a placement of {place.shape} for a tree of {tree.n} nodes")
    out = np.zeros(MAX_NODES, dtype=np.int64)
    out[:tree.n] = place[list(tree.inorder)]
    return out


class SchedulerEnv(gymnasium.Env):
    """SCHEDULERENV (§6.1; module docstring). ``trees``: the training inputs, or an int seed
    to draw ``tree_count`` of them with ``sample_trees``; ``devices``: D, the action's device
    count (must equal the reward source's); exactly one of ``measure`` / ``simulate``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, net: str, width: int | None, trees: list[Tree] | int, devices: int, *,
                 measure: Executor | None = None, simulate: Machine | None = None, normalized: bool = False,
                 repeats: int = 10, tree_count: int = 1000) -> None:
        super().__init__()
        if (measure is None) == (simulate is None):
            raise PipeplanError("SchedulerEnv: give exactly one reward source, measure=Executor or simulate=Machine")
        model = build_net(net, width)  # checks the name, resolves the paper's default width
        self.net, self.width = net, int(model.width)
        if isinstance(trees, (int, np.integer)):
            trees = sample_trees(net, tree_count, int(trees), max_nodes=MAX_NODES)
        self.trees: list[Tree] = [t for t in trees if t.n <= MAX_NODES]  # §6.1: larger inputs removed
        if not self.trees:
            raise PipeplanError(f"SchedulerEnv: no training tree of at most {MAX_NODES} nodes")
        source_devices = len(measure.devices) if measure is not None else len(simulate.devices)
        if int(devices) != source_devices or devices < 1:
            raise PipeplanError(f"SchedulerEnv: {devices} devices asked, the reward source has {source_devices}")
        if measure is not None:
            kind = getattr(measure.replicas.net(0), "kind", net)
            if kind != net:
                raise PipeplanError(f"SchedulerEnv: the executor runs {kind!r}, not {net!r}")
            if repeats < 1:
                raise PipeplanError(f"SchedulerEnv: repeats must be >= 1, got {repeats}")
        self.devices, self.executor, self.machine = int(devices), measure, simulate
        self.normalized, self.repeats = bool(normalized), int(repeats)
        self.observation_space = spaces.Box(-1.0, 1.0, (MAX_NODES, EMBED_DIM), np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(MAX_NODES, self.devices, dtype=np.int64))
        self._obs: dict[int, np.ndarray] = {}
        self._profiles: dict[Tree, simulator.TreeProfile] = {}
        self._cpu_ms: dict[Tree, float] = {}
        self._tree: int | None = None

    # -- rewards -------------------------------------------------------------------------
    def forward_ms(self, tree: Tree, placement) -> float:
        """Milliseconds of ``tree``'s forward pass with node i on device ``placement[i]``."""
        if self.executor is not None:
            return 1e3 * self.executor.time(tree, placement, self.repeats)
        return 1e3 * simulator.simulate(self.profile(tree), placement, self.machine)

    def profile(self, tree: Tree) -> simulator.TreeProfile:
        """The cost model's profile of ``tree`` (cached per tree)."""
        prof = self._profiles.get(tree)
        if prof is None:
            prof = self._profiles[tree] = simulator.profile(tree, self.net, self.width)
        return prof

    def cpu_ms(self, tree: Tree) -> float:
        """Milliseconds of ``tree`` all on device 0 (cached per tree)."""
        ms = self._cpu_ms.get(tree)
        if ms is None:
            ms = self._cpu_ms[tree] = self.forward_ms(tree, [0] * tree.n)
        return ms

    def score(self, tree: Tree, placement) -> tuple[float, float]:
        """(reward, ms) of a placement in node order, for any tree (the agent's evaluation
        uses it on held-out trees); draws no random numbers."""
        ms = self.forward_ms(tree, placement)
        return (-ms / self.cpu_ms(tree) if self.normalized else -ms), ms

    # -- gymnasium API -------------------------------------------------------------------
    def observation(self, index: int) -> np.ndarray:
        obs = self._obs.get(index)
        if obs is None:
            obs = self._obs[index] = encode(self.trees[index])
        return obs.copy()

    def _reset_info(self, index: int) -> dict[str, Any]:
        tree = self.trees[index]
        return {"mask": node_mask(tree), "tree": index, "nodes": tree.n}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "tree" in options:
            index = int(options["tree"])
            if not 0 <= index < len(self.trees):
                raise PipeplanError(f"reset: tree {index} is not one of the {len(self.trees)} training trees")
        else:
            index = int(self.np_random.integers(len(self.trees)))
        self._tree = index
        return self.observation(index), self._reset_info(index)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._tree is None:
            raise RuntimeError("the episode is over (one step per episode): call reset() before step()")
        index, self._tree = self._tree, None
        tree = self.trees[index]
        a = np.asarray(action)
        if a.shape != (MAX_NODES,):
            raise ValueError(f"an action is {MAX_NODES} device indices (one per in-order position), got shape "
                             f"{a.shape}")
        placement = placement_of(tree, a)
        if min(placement) < 0 or max(placement) >= self.devices:
            raise ValueError(f"action: a device index outside 0..{self.devices - 1} for a node of the tree")
        reward, ms = self.score(tree, placement)
        info = {**self._reset_info(index), "ms": ms, "placement": placement}
        if self.normalized:
            info["cpu_ms"] = self.cpu_ms(tree)
        return self.observation(index), float(reward), True, False, info
