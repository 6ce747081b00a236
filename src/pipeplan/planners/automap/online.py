"""Auto-MAP's pipeline search by online training (auto-map.txt §3.4, §4.4): a DQN cuts one
model into K stages, one pivot per step, and learns on that model alone.

``CutEnv`` is the environment (gymnasium): the observation is the three features of every
candidate pivot (``CutProblem.features``) and a one-hot of the step; the action is a
candidate pivot, masked (§4.4) to the pivots pruning left and the ones after the last cut;
the reward comes at the last cut, 1/L (or -1/sqrt(L) out of memory; ``CutProblem.reward``).
``train_online`` is the loop: DQN episodes until the greedy policy's plan has stopped
changing value by more than 0.1% (converged; at operator granularity neighbouring pivots
around a cheap op give almost the same time, which Q-values cannot rank) or the budget is
spent; the plan is the best seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from ...learn.dqn import Agent, Config, run_episode
from ...learn.harness import Budget, Curve, Point, Progress
from .problem import CutProblem

CHECK_EVERY = 25      # episodes between greedy checks of the policy
PATIENCE = 8          # greedy checks (epsilon at its floor) without a change of value that mean converged
OBS_CACHE = 20000     # observations kept (one per distinct prefix of cuts)
STABLE = 1e-3         # greedy values this close count as unchanged (Q cannot tell such plans apart)


def online_config(seed: int = 0) -> Config:
    """§5.1's pipeline hyper-parameters; a trunk of two 128-unit layers (ours: the paper
    sizes its networks per task), an update every step."""
    return Config(hidden=(128, 128), seed=seed)


class CutEnv(gym.Env):
    """One episode = K-1 cuts of ``problem``'s model."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, problem: CutProblem) -> None:
        self.problem = problem
        a, k = problem.pivots.size, problem.stages - 1
        self.observation_space = gym.spaces.Box(0.0, np.inf, shape=(3 * a + k,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(a)
        self.cuts: list[int] = []
        self.seen: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def _obs(self) -> tuple[np.ndarray, dict]:
        """The observation of the cuts so far: computed once per distinct prefix of cuts."""
        key = tuple(self.cuts)
        if key not in self.seen:
            p = self.problem
            step = np.zeros(p.stages - 1, dtype=np.float32)
            if len(self.cuts) < p.stages - 1:
                step[len(self.cuts)] = 1.0
                feats, mask = p.features(self.cuts), p.mask(self.cuts)
            else:
                feats, mask = np.zeros((3, p.pivots.size)), np.zeros(p.pivots.size, dtype=bool)
            if len(self.seen) >= OBS_CACHE:
                self.seen.clear()
            self.seen[key] = (np.concatenate([np.minimum(feats, 10.0).ravel(), step]).astype(np.float32), mask)
        obs, mask = self.seen[key]
        return obs, {"action_mask": mask, "cuts": list(self.cuts)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cuts = []
        return self._obs()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        p = self.problem
        self.cuts.append(int(p.pivots[int(action)]))
        done = len(self.cuts) == p.stages - 1
        reward = 0.0
        obs, info = self._obs()
        if done:
            it, fits = p.value(self.cuts)
            reward = p.reward(it, fits)
            info.update(iteration_s=it, fits=fits)
        return obs, reward, done, False, info


@dataclass
class Online:
    """A training run's outcome: the best plan seen (cuts, iteration, fits), the greedy
    policy's last plan, when the search converged (None: it did not within the budget),
    and its figures."""

    cuts: list[int]
    iteration_s: float
    fits: bool
    greedy: list[int]
    converged_s: float | None
    best_found_s: float
    elapsed_s: float
    episodes: int
    steps: int
    evaluations: int
    curve: Curve


def _better(it: float, fits: bool, best: tuple[float, bool]) -> bool:
    return (fits, -it) > (best[1], -best[0])


def train_online(problem: CutProblem, budget: Budget, cfg: Config | None = None,
                 progress: Progress | None = None) -> Online:
    """DQN episodes on ``problem`` until converged or ``budget`` (in episodes) is spent."""
    import torch

    torch.set_num_threads(1)  # a small MLP: one thread is fastest and reproducible
    cfg = cfg or online_config()
    env = CutEnv(problem)
    agent = Agent(env.observation_space.shape[0], env.action_space.n, cfg)
    curve = Curve("mean reward (1/L, last 25 episodes)", "greedy policy's reward", "episode")
    best: tuple[float, bool] = (np.inf, False)
    best_cuts: list[int] = []
    best_s = 0.0
    greedy: list[int] = []
    streak, since, converged, episode, returns = 0, 0.0, None, 0, []
    while budget.left(episode) and converged is None:
        ret, _, info = run_episode(env, agent)
        episode += 1
        returns.append(ret)
        if _better(info["iteration_s"], info["fits"], best):
            best, best_cuts, best_s = (info["iteration_s"], info["fits"]), info["cuts"], budget.elapsed
        if episode % CHECK_EVERY:
            continue
        g_ret, _, g_info = run_episode(env, agent, explore=False, learn=False)
        if not greedy or not np.isclose(g_info["iteration_s"], problem.value(greedy)[0], rtol=STABLE, atol=0):
            greedy, streak, since = g_info["cuts"], 0, budget.elapsed
        elif agent.epsilon <= cfg.eps_end + 1e-9:
            streak += 1
            converged = since if streak >= PATIENCE else None
        curve.add(Point(episode, budget.elapsed, len(problem.cache), float(np.mean(returns[-CHECK_EVERY:])),
                        g_ret, best[0]))
        if progress is not None:
            progress(curve.points[-1], budget.fraction(episode))
    return Online(best_cuts, best[0], best[1], greedy, converged, best_s, budget.elapsed, episode, agent.steps,
                  len(problem.cache), curve)
