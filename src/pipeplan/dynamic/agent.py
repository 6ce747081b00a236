"""DynPartition's Deep Q-learning agent (dynpartition.txt §6.2, §8.2), after the original
program (fanpu/DynPartition). One module, read top to bottom: ``Config``, the Q-network, the
replay buffer, the agent (``act``, ``learn``, ``policy``, ``save``/``load``) and ``train``,
the loop.

An episode is one step (§6.1), so the DQN is a contextual bandit: the Q-value of a joint
action (a device per node) is the sum over the tree's nodes of the network's per-node,
per-device entries, regressed by MSE onto the episode's reward; no bootstrapping, so no
discount and no target network. Exploration is epsilon-greedy per node (§6.2: "for each
node, with 1 - epsilon probability, it chooses the best device predicted by the network,
and with epsilon probability, it chooses a device at random"); testing is greedy (argmax per
node). The replay buffer "avoid[s] catastrophic forgetting and recency bias" (§6.2).

Differences from the original, all deliberate: the joint Q sums only the tree's nodes (the
original summed all 128 rows, padding included); the observation's parent feature is the
parent's position (``env.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from ..learn.harness import (Budget, Curve, Point, Progress, check_state, checkpoint, config_from, load_checkpoint,
                             seed_everything, trained_count)
from .env import EMBED_DIM, MAX_NODES, SchedulerEnv, encode, placement_of
from .trees import Tree, sample_trees

AGENT = "dynpartition"
#: held-out trees are drawn with ``sample_trees(net, eval_trees, config.seed + HELD_OUT_SEED)``
HELD_OUT_SEED = 7_919_011


@dataclass
class Config:
    """The original program's hyper-parameters unless noted."""

    hidden: tuple[int, ...] = (16, 16)   # Flatten(128*32) -> 16 -> ReLU -> 16 -> ReLU -> 128*D
    lr: float = 5e-4                     # Adam
    eps: float = 0.05                    # constant, per node (§6.2)
    replay_size: int = 50_000            # deque(maxlen=50000)
    batch_size: int = 32
    learn_start: int = 32                # ours: the first update once a batch is stored
    episodes: int = 10_000               # §8.2, Fig. 12: "over 10,000 episodes"
    seed: int = 0
    eval_every: int = 500                # ours: episodes between greedy evaluations (0: none)
    eval_trees: int = 32                 # ours: held-out trees of a greedy evaluation


class QNetwork(nn.Module):
    """(batch, 128, 32) observations -> (batch, 128, D) Q-entries: in-order node k's value
    of each device. An MLP over the flattened observation, Xavier-initialized."""

    def __init__(self, devices: int, hidden: tuple[int, ...] = (16, 16), max_nodes: int = MAX_NODES,
                 embed: int = EMBED_DIM) -> None:
        super().__init__()
        self.devices, self.max_nodes = devices, max_nodes
        layers: list[nn.Module] = [nn.Flatten()]
        width = max_nodes * embed
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, max_nodes * devices))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(obs).view(len(obs), self.max_nodes, self.devices)


def joint_q(q: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(batch,) Q of each joint action: the chosen entries summed over the real nodes."""
    return (q.gather(2, actions[..., None]).squeeze(2) * mask).sum(dim=1)


class Replay:
    """A ring of (observation, action, reward) transitions in numpy. An observation is one
    tree's encoding, so each distinct one is stored once (keyed by its bytes) and a
    transition holds its row: 50,000 transitions of 16 KiB observations would be 800 MB,
    the distinct trees of a training set are a few thousand at most."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity, self.rng, self.size, self.head = capacity, rng, 0, 0
        self.obs_row = np.zeros(capacity, dtype=np.int64)
        self.action = np.zeros((capacity, MAX_NODES), dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self._rows: dict[bytes, int] = {}
        self._obs = np.zeros((16, MAX_NODES, EMBED_DIM), dtype=np.float32)
        self._mask = np.zeros((16, MAX_NODES), dtype=np.float32)

    def _row(self, obs: np.ndarray, mask: np.ndarray) -> int:
        key = obs.tobytes()
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = len(self._rows)
            if row == len(self._obs):  # grow by doubling
                self._obs = np.concatenate([self._obs, np.zeros_like(self._obs)])
                self._mask = np.concatenate([self._mask, np.zeros_like(self._mask)])
            self._obs[row], self._mask[row] = obs, mask
        return row

    def add(self, obs: np.ndarray, mask: np.ndarray, action: np.ndarray, reward: float) -> None:
        i = self.head
        self.obs_row[i], self.action[i], self.reward[i] = self._row(obs, mask), action, reward
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Observations, masks, actions, rewards of ``n`` distinct transitions."""
        idx = self.rng.choice(self.size, size=n, replace=False)
        rows = self.obs_row[idx]
        return self._obs[rows], self._mask[rows], self.action[idx], self.reward[idx]


class Agent:
    """The Q-network, Adam, the replay buffer and a random generator (exploration, sampling)."""

    def __init__(self, devices: int, config: Config) -> None:
        self.config, self.devices = config, int(devices)
        self.q = QNetwork(self.devices, tuple(config.hidden))
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=config.lr)
        self.rng = np.random.default_rng(config.seed)
        self.replay = Replay(config.replay_size, self.rng)
        self.updates = 0
        self.trained_on: dict[str, Any] = {}  # a loaded checkpoint's record of what it trained on

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """(batch, 128) argmax devices of (batch, 128, 32) observations."""
        return self.q(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=2).numpy()

    def act(self, obs: np.ndarray, mask: np.ndarray, eps: float) -> np.ndarray:
        """(128,) int64 action: per real node the greedy device, or with probability ``eps`` a
        uniformly random one; padding entries 0."""
        a = self.greedy(obs[None])[0]
        explore = self.rng.random(MAX_NODES) < eps
        a = np.where(explore, self.rng.integers(self.devices, size=MAX_NODES), a)
        return np.where(mask, a, 0).astype(np.int64)

    def learn(self) -> float | None:
        """One Adam step on MSE(joint Q, reward) over a replayed batch; the loss (None until
        ``learn_start`` transitions are stored)."""
        cfg = self.config
        if self.replay.size < max(cfg.learn_start, cfg.batch_size):
            return None
        obs, mask, act, rew = (torch.from_numpy(x) for x in self.replay.sample(cfg.batch_size))
        loss = nn.functional.mse_loss(joint_q(self.q(obs), act, mask), rew)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return loss.item()

    def policy(self, trees: list[Tree]) -> list[list[int]]:
        """Greedy placements (node order, device per node) of ``trees``."""
        if not trees:
            return []
        actions = self.greedy(np.stack([encode(t) for t in trees]))
        return [placement_of(t, a) for t, a in zip(trees, actions)]

    def checkpoint(self, trained_on: dict[str, Any] | None = None) -> dict:
        """The checkpoint's contents (``harness.checkpoint``, agent ``dynpartition``)."""
        return checkpoint(AGENT, self.config, {k: v.detach().clone() for k, v in self.q.state_dict().items()},
                          {**(trained_on or {}), "devices": self.devices})

    def save(self, path: str, trained_on: dict[str, Any] | None = None) -> str:
        """Write the checkpoint at ``path``."""
        torch.save(self.checkpoint(trained_on), path)
        return path

    @classmethod
    def load(cls, path: str) -> "Agent":
        """An agent from ``save``'s checkpoint (its greedy policy; the replay starts empty)."""
        data = load_checkpoint(path, AGENT)
        cfg = config_from(Config, data["config"], path)
        devices = trained_count(data, "devices", path)
        check_state(data["state"], lambda: QNetwork(devices, cfg.hidden), path)
        agent = cls(devices, cfg)
        agent.q.load_state_dict(data["state"])
        agent.trained_on = data["trained_on"]
        return agent


def evaluate(agent: Agent, env: SchedulerEnv, trees: list[Tree]) -> tuple[float, float]:
    """(mean reward, mean ms) of the greedy policy on ``trees``, scored by ``env``."""
    scores = [env.score(t, p) for t, p in zip(trees, agent.policy(trees))]
    return float(np.mean([s[0] for s in scores])), float(np.mean([s[1] for s in scores]))


@dataclass
class Result:
    """A training run: the agent, the per-episode rewards and forward ms, the greedy
    evaluations ``(episode, mean reward)``, the curve (a point per episode: its reward, the
    latest greedy mean reward as the baseline, the best greedy mean forward seconds so far)."""

    agent: Agent
    episodes: int
    rewards: np.ndarray
    ms: np.ndarray
    evals: list[tuple[int, float]]
    curve: Curve
    elapsed_s: float
    held_out: list[Tree] = field(default_factory=list)


def train(env: SchedulerEnv, config: Config, budget: Budget, progress: Progress | None = None,
          eval_fn: Callable[[Agent], tuple[float, float]] | None = None) -> Result:
    """Train on ``env`` for ``config.episodes`` episodes or until ``budget`` is spent (its
    ``evaluations`` count training episodes). Every ``eval_every`` episodes (and before the
    first and after the last) the greedy policy is evaluated: ``eval_fn(agent)`` -> (mean
    reward, mean ms), or by default ``evaluate`` on ``eval_trees`` held-out trees scored by ``env``."""
    seed_everything(config.seed)
    agent = Agent(env.devices, config)
    held_out: list[Tree] = []
    if eval_fn is None and config.eval_every > 0:
        held_out = sample_trees(env.net, config.eval_trees, config.seed + HELD_OUT_SEED, max_nodes=MAX_NODES)
    curve = Curve("episode reward", "greedy held-out mean reward", "episode", "best greedy held-out mean (s)")
    rewards, ms, evals = [], [], []
    best_s, baseline = float("nan"), float("nan")

    def evaluation(episode: int) -> None:
        nonlocal best_s, baseline
        baseline, mean_ms = eval_fn(agent) if eval_fn is not None else evaluate(agent, env, held_out)
        best_s = mean_ms / 1e3 if math.isnan(best_s) else min(best_s, mean_ms / 1e3)
        evals.append((episode, baseline))

    if config.eval_every > 0:
        evaluation(0)
    obs, info = env.reset(seed=config.seed)
    episode = 0
    more = config.episodes > 0 and budget.left(0)
    while more:
        if episode:
            obs, info = env.reset()
        action = agent.act(obs, info["mask"], config.eps)
        _, reward, _, _, step_info = env.step(action)
        agent.replay.add(obs, info["mask"], action, reward)
        agent.learn()
        episode += 1
        rewards.append(reward)
        ms.append(step_info["ms"])
        more = episode < config.episodes and budget.left(episode)
        if config.eval_every > 0 and (episode % config.eval_every == 0 or not more):
            evaluation(episode)
        point = Point(episode, budget.elapsed, episode, float(reward), baseline, best_s)
        curve.add(point)
        if progress is not None and (episode % 10 == 0 or not more):
            progress(point, budget.fraction(episode))
    return Result(agent, episode, np.asarray(rewards), np.asarray(ms), evals, curve, budget.elapsed, held_out)


def trained_on(env: SchedulerEnv, machine_model: dict | None = None) -> dict[str, Any]:
    """What a checkpoint records of the environment trained on (simulated: with the machine
    model its CPU came from, ``machines.machine_model``)."""
    source = "measure" if env.executor is not None else "simulate"
    names = env.executor.devices if env.executor is not None else env.machine.names
    out = {"net": env.net, "width": env.width, "devices": env.devices, "device_names": list(names),
           "reward": source, "normalized": env.normalized, "trees": len(env.trees)}
    return out if machine_model is None else {**out, "machine_model": machine_model}


__all__ = ["AGENT", "Agent", "Config", "QNetwork", "Replay", "Result", "evaluate", "joint_q", "train", "trained_on"]
