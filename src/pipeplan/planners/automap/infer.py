"""Auto-MAP's pipeline planning by online inference (auto-map.txt §3.5, §4.5): a DQN trained
once on generated array-partition problems, then asked for any model zero-shot.

Training data (§4.5.1 "Data Generation"): instances whose C, A, W are drawn from uniform,
normal and binomial distributions (plus, with ``data="mix"``, the zoo's training models),
each through the same prefix-sum / coarsen / normalize steps as a real model; each instance
is played ``EPISODES_PER_INSTANCE`` = 50 times (§3.5.3). Clusters are drawn too (1-4
servers of 4 or 8 GPUs, links between servers 2-100x slower), and so are K and M.

State (§4.5.2): C*, A*, W*, the topology matrix (padded to 32 x 32), the partition so far
(boundary marks over the 128 points, device-cut marks over the devices); ours besides: C*
over its total (where the compute fractions lie), the step, and K, N, M as scalars.
Actions (§4.5.2): partition boundaries and device cuts share one action space of 128: the
steps alternate, boundary j then device cut j. Reward: 1/L at the last step (L in units of
the instance's ideal iteration, as online).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from ...errors import PipeplanError
from .arrays import MAX_DEVICES, POINTS, Instance, coarsen

EPISODES_PER_INSTANCE = 50      # §3.5.3
MAX_STAGES = 8
DISTRIBUTIONS = ("uniform", "normal", "binomial")
SHIPPED = Path(__file__).with_name("automap-infer.pt")


# -- training data ------------------------------------------------------------------------------
def _draw(rng: np.random.Generator, dist: str, n: int) -> np.ndarray:
    if dist == "uniform":
        return rng.random(n)
    if dist == "normal":
        return np.clip(rng.normal(0.5, 0.2, n), 0.0, 1.0)
    return rng.binomial(10, rng.uniform(0.1, 0.9), n) / 10.0


def random_topology(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A hierarchical cluster's normalized bandwidths and its number of servers."""
    servers = int(rng.integers(1, 5))
    gpus = int(rng.choice([4, 8])) if servers > 1 else int(rng.choice([2, 4, 8]))
    inter = 10 ** rng.uniform(-2, np.log10(0.5))
    server = np.repeat(np.arange(servers), gpus)
    topo = np.where(server[:, None] == server[None, :], 1.0, inter)
    return topo, servers


def generated(rng: np.random.Generator, dist: str | None = None) -> Instance:
    """One generated instance (§4.5.1): C, A, W from one distribution, random relative
    scales (compute- to communication-bound), a random cluster, K and M."""
    dist = dist or str(rng.choice(DISTRIBUTIONS))
    n = int(rng.integers(POINTS, 4000))
    compute = _draw(rng, dist, n)
    act = np.concatenate(([0.0], _draw(rng, dist, n - 1), [0.0])) * 10 ** rng.uniform(-3, 0)
    params = _draw(rng, dist, n) * (rng.random(n) < rng.uniform(0.05, 0.6)) * 10 ** rng.uniform(-3, 0)
    topo, servers = random_topology(rng)
    stages = servers if servers > 1 else int(rng.integers(2, 5))
    c, a, w, pos, top = coarsen(compute, act, params)
    return Instance(c, a, w, topo, int(rng.choice([4, 8, 16, 32])), min(stages, topo.shape[0]), pos, top, dist)


# -- environment ---------------------------------------------------------------------------------
class InferEnv(gym.Env):
    """One episode = K-1 boundaries and K-1 device cuts of one instance, alternating."""

    metadata: dict[str, Any] = {"render_modes": []}
    OBS = 5 * POINTS + MAX_DEVICES * MAX_DEVICES + MAX_DEVICES + 2 * (MAX_STAGES - 1) + 3

    def __init__(self, sample: Callable[[], Instance] | None = None) -> None:
        self.sample = sample
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(self.OBS,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(POINTS)
        self.inst: Instance | None = None
        self.played = 0
        self.cache: dict[tuple, float] = {}

    def use(self, inst: Instance) -> None:
        if inst.stages > MAX_STAGES:
            raise PipeplanError(f"automap-infer: {inst.stages} stages; the agent plans up to {MAX_STAGES}")
        self.inst, self.played, self.cache = inst, 0, {}
        self._static = self._static_part(inst)

    @staticmethod
    def _static_part(inst: Instance) -> np.ndarray:
        topo = np.zeros((MAX_DEVICES, MAX_DEVICES))
        n = inst.devices
        topo[:n, :n] = inst.topology
        frac = inst.C / inst.C[-1] if inst.C[-1] > 0 else inst.C
        scalars = [inst.stages / MAX_STAGES, n / MAX_DEVICES, np.log2(inst.microbatches) / 6.0]
        return np.concatenate([inst.C, inst.A, inst.W, frac, topo.ravel(), scalars])

    def mask(self) -> np.ndarray:
        inst, k = self.inst, len(self.bounds) + len(self.dcuts)
        ok = np.zeros(POINTS, dtype=bool)
        if k == 2 * (inst.stages - 1):
            return ok
        j = len(self.dcuts)
        if k % 2 == 0:  # a boundary: after the last, at a new real position, leaving room for the rest
            pos = inst.positions
            last = self.bounds[-1] if self.bounds else 0
            uniq = np.unique(pos)
            later = uniq.size - 2 - np.searchsorted(uniq, pos)  # distinct positions strictly inside (pos, end)
            ok = (np.arange(POINTS) > last) & (pos > pos[last]) & (pos < pos[-1]) & (later >= inst.stages - 2 - j)
        else:
            last = self.dcuts[-1] if self.dcuts else 0
            d = np.arange(POINTS)
            ok = (d > last) & (d <= inst.devices - (inst.stages - 1 - j))
        return ok

    def _obs(self) -> tuple[np.ndarray, dict]:
        marks = np.zeros(POINTS)
        marks[self.bounds] = 1.0
        dmarks = np.zeros(MAX_DEVICES)
        dmarks[self.dcuts] = 1.0
        step = np.zeros(2 * (MAX_STAGES - 1))
        k = len(self.bounds) + len(self.dcuts)
        if k < 2 * (self.inst.stages - 1):
            step[k] = 1.0
        obs = np.concatenate([self._static[:4 * POINTS], marks, self._static[4 * POINTS:4 * POINTS + MAX_DEVICES ** 2],
                              dmarks, step, self._static[-3:]]).astype(np.float32)
        return obs, {"action_mask": self.mask(), "bounds": list(self.bounds), "dcuts": list(self.dcuts)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.sample is not None and (self.inst is None or self.played >= EPISODES_PER_INSTANCE):
            self.use(self.sample())
        self.played += 1
        self.bounds, self.dcuts = [], []
        return self._obs()

    def value(self, bounds: list[int], dcuts: list[int]) -> float:
        key = (*bounds, -1, *dcuts)
        if key not in self.cache:
            self.cache[key] = float(self.inst.values(np.asarray([bounds]), np.asarray([dcuts]))[0])
        return self.cache[key]

    def ideal(self) -> float:
        return self.inst.microbatches * self.inst.C[-1] / self.inst.devices

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        (self.bounds if len(self.bounds) == len(self.dcuts) else self.dcuts).append(int(action))
        done = len(self.dcuts) == self.inst.stages - 1
        obs, info = self._obs()
        reward = 0.0
        if done:
            length = self.value(self.bounds, self.dcuts)
            reward = self.ideal() / length if np.isfinite(length) and length > 0 else -1.0
            info["value"] = length
        return obs, reward, done, False, info


@dataclass
class Inferred:
    bounds: list[int]
    dcuts: list[int]
    value: float
    seconds: float
    extra: dict = field(default_factory=dict)
