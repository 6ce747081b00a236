"""Auto-MAP's Rainbow-style DQN (auto-map.txt §2 "The Rainbow agent", §5.1 hyper-parameters).

From Rainbow (Hessel et al. 2018) Auto-MAP keeps prioritized experience replay (Schaul et
al. 2016; alpha 0.2, beta 0.6), double DQN (van Hasselt et al. 2016) and the dueling
architecture (Wang et al. 2016); it drops the noisy layers and explores epsilon-greedily,
epsilon decayed linearly from 1.0 to 0.1. gamma 0.6, target network copied every 100 steps,
replay of 2,000 transitions, batches of 64, Adam (lr 1e-3 for pipeline tasks, 5e-4 for the
partitioning tasks). Invalid actions get Q = -inf (§4.4) when acting and when bootstrapping.

The replay buffer is written here (numpy, proportional priorities): torchrl is not a
dependency of pipeplan, and for 2,000 transitions a sum-tree buys nothing over sampling from
the normalized priorities directly. One module, read top to bottom: ``Config``, the network,
the buffer, the agent (act, learn), and ``run_episodes``, the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch
from torch import nn


@dataclass
class Config:
    """Auto-MAP §5.1 (pipeline tasks) unless noted."""

    hidden: tuple[int, ...] = (256, 256)   # §2: "we adjust the number of DNN layers for different tasks"
    lr: float = 1e-3
    gamma: float = 0.6
    batch_size: int = 64
    replay_size: int = 2000
    alpha: float = 0.2                     # priority exponent
    beta: float = 0.6                      # importance-sampling exponent
    eps_start: float = 1.0
    eps_end: float = 0.1
    eps_decay_steps: int = 10000           # pipeline tasks: 10,000 iterations (§5.1)
    target_every: int = 100
    learn_start: int = 64                  # transitions stored before the first update (ours)
    train_every: int = 1                   # environment steps per update (ours; CleanRL's train_frequency)
    grad_clip: float = 10.0                # ours: Huber loss + clipped gradients
    priority_eps: float = 1e-3             # keeps every transition sampleable (Schaul et al.)
    point_features: int = 0                # > 0: observations are per-action feature rows (PointwiseQ)
    seed: int = 0


class DuelingQ(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) over an MLP trunk (Wang et al. 2016)."""

    def __init__(self, obs_dim: int, actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.trunk(obs)
        a = self.advantage(z)
        return self.value(z) + a - a.mean(dim=-1, keepdim=True)


class PointwiseQ(nn.Module):
    """A dueling Q-network for observations laid out per action: ``actions`` rows of
    ``features`` numbers, then globals. One MLP scores every action's row (with the globals);
    V(s) reads the rows' mean hidden state. Ours: it lets one small network rank actions of
    any instance by what each would do, rather than by its index."""

    def __init__(self, obs_dim: int, actions: int, hidden: tuple[int, ...], features: int) -> None:
        super().__init__()
        self.actions, self.features = actions, features
        layers: list[nn.Module] = []
        width = features + obs_dim - actions * features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.advantage = nn.Linear(width, 1)
        self.value = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        rows = obs[:, :self.actions * self.features].reshape(len(obs), self.actions, self.features)
        glob = obs[:, self.actions * self.features:]
        z = self.trunk(torch.cat([rows, glob[:, None, :].expand(-1, self.actions, -1)], dim=2))
        a = self.advantage(z).squeeze(2)
        return self.value(z.mean(dim=1)) + a - a.mean(dim=-1, keepdim=True)


def q_network(obs_dim: int, actions: int, cfg: "Config") -> nn.Module:
    if cfg.point_features:
        return PointwiseQ(obs_dim, actions, cfg.hidden, cfg.point_features)
    return DuelingQ(obs_dim, actions, cfg.hidden)


class PrioritizedReplay:
    """A ring of transitions (obs, action, reward, next obs, next mask, done), sampled with
    probability p_i^alpha / sum p^alpha and weighted by (N P(i))^-beta / max (Schaul et al.)."""

    def __init__(self, capacity: int, obs_dim: int, actions: int, rng: np.random.Generator) -> None:
        self.capacity, self.rng, self.size, self.head = capacity, rng, 0, 0
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_mask = np.zeros((capacity, actions), dtype=bool)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.done = np.zeros(capacity, dtype=np.float32)
        self.priority = np.zeros(capacity)

    def add(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, next_mask: np.ndarray,
            done: bool) -> None:
        i = self.head
        self.obs[i], self.action[i], self.reward[i] = obs, action, reward
        self.next_obs[i], self.next_mask[i], self.done[i] = next_obs, next_mask, float(done)
        self.priority[i] = self.priority[:self.size].max() if self.size else 1.0  # new ones are seen first
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int, alpha: float, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Indices and their importance-sampling weights."""
        p = self.priority[:self.size] ** alpha
        p /= p.sum()
        idx = self.rng.choice(self.size, size=n, p=p)
        w = (self.size * p[idx]) ** (-beta)
        return idx, (w / w.max()).astype(np.float32)

    def update(self, idx: np.ndarray, td_error: np.ndarray, eps: float) -> None:
        self.priority[idx] = np.abs(td_error) + eps


def masked(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Q-values with invalid actions at -inf (§4.4)."""
    return q.masked_fill(~mask, float("-inf"))


class Agent:
    """Online and target dueling networks, the replay buffer, and epsilon."""

    def __init__(self, obs_dim: int, actions: int, cfg: Config) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.online = q_network(obs_dim, actions, cfg)
        self.target = q_network(obs_dim, actions, cfg)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=cfg.lr, foreach=True)
        self.replay = PrioritizedReplay(cfg.replay_size, obs_dim, actions, self.rng)
        self.steps = self.updates = 0

    @property
    def epsilon(self) -> float:
        frac = min(1.0, self.steps / max(1, self.cfg.eps_decay_steps))
        return self.cfg.eps_start + frac * (self.cfg.eps_end - self.cfg.eps_start)

    @torch.no_grad()
    def greedy(self, obs: np.ndarray, mask: np.ndarray) -> int:
        q = self.online(torch.as_tensor(obs, dtype=torch.float32)[None])[0]
        return int(masked(q, torch.as_tensor(mask)).argmax())

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """Epsilon-greedy over the valid actions."""
        self.steps += 1
        if self.rng.random() < self.epsilon:
            return int(self.rng.choice(np.flatnonzero(mask)))
        return self.greedy(obs, mask)

    def learn(self) -> float | None:
        """One double-DQN update on a prioritized batch; the target net follows every
        ``target_every`` updates. Returns the loss (None before ``learn_start``)."""
        cfg, buf = self.cfg, self.replay
        if buf.size < max(cfg.learn_start, cfg.batch_size):
            return None
        idx, w = buf.sample(cfg.batch_size, cfg.alpha, cfg.beta)
        obs, nxt = torch.from_numpy(buf.obs[idx]), torch.from_numpy(buf.next_obs[idx])
        act, rew = torch.from_numpy(buf.action[idx]), torch.from_numpy(buf.reward[idx])
        done, nmask = torch.from_numpy(buf.done[idx]), torch.from_numpy(buf.next_mask[idx])
        both = self.online(torch.cat([obs, nxt]))  # one pass of the online net over s and s'
        q = both[:len(idx)].gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():  # double DQN: the online net picks, the target net values
            nmask = nmask | (done[:, None] > 0)  # a terminal row has no next action: any is fine
            pick = masked(both[len(idx):].detach(), nmask).argmax(dim=1, keepdim=True)
            future = self.target(nxt).gather(1, pick).squeeze(1) * (1.0 - done)
            target = rew + cfg.gamma * future
        td = target - q
        loss = (torch.from_numpy(w) * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.online.parameters(), cfg.grad_clip)
        self.optimizer.step()
        buf.update(idx, td.detach().numpy(), cfg.priority_eps)
        self.updates += 1
        if self.updates % cfg.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())
        return loss.item()


class Env(Protocol):
    """What the loop needs of an environment: gymnasium's reset/step, with the valid actions
    in ``info["action_mask"]``."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]: ...

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]: ...


def run_episode(env: Env, agent: Agent, explore: bool = True, learn: bool = True) -> tuple[float, list[int], dict]:
    """One episode: act (epsilon-greedy when ``explore``), store, learn after every step.
    Returns the episode's return, its actions and the last step's info."""
    obs, info = env.reset()
    total, actions, done = 0.0, [], False
    while not done:
        mask = info["action_mask"]
        a = agent.act(obs, mask) if explore else agent.greedy(obs, mask)
        nxt, r, terminated, truncated, info = env.step(a)
        done = terminated or truncated
        if learn:
            agent.replay.add(obs, a, r, nxt, info["action_mask"], terminated)
            if agent.steps % agent.cfg.train_every == 0:
                agent.learn()
        total += r
        actions.append(a)
        obs = nxt
    return total, actions, info


def run_episodes(env: Env, agent: Agent, keep_going: Callable[[int], bool],
                 on_episode: Callable[[int, float, list[int], dict], None] | None = None) -> int:
    """The training loop: episodes while ``keep_going(episode)``; returns how many ran."""
    episode = 0
    while keep_going(episode):
        ret, actions, info = run_episode(env, agent)
        episode += 1
        if on_episode is not None:
            on_episode(episode, ret, actions, info)
    return episode
