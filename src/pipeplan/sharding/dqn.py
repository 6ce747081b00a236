"""Auto-MAP's operator partitioning (OPP) and auto data parallelism (ADP) by DQN
(auto-map.txt §3.2-3.3, §4.2-4.3, §5.2.1-5.2.2).

The state is the decision vector (every dimension of every trainable variable, or of every
input tensor for ADP: 1 partitioned, 0 replicated, -1 undecided) and the current position
(one-hot); the action partitions or replicates the dimension at the current position;
propagation (``sharding.propagate``) then decides what follows from it. Positions are visited in
the order of their linkage groups' sizes (§4.2). Rewards (``Config.reward``):

- ``paper``: +0.4 for every dimension the step partitioned and +0.1 for every one it
  replicated, counting those decided through propagation; -1 and the end of the episode on
  a conflict (§4.2);
- ``cost`` (ours, docs/opp.md): 0 until the plan is complete, then the all-replicated plan's
  predicted step time over this plan's (``sharding.cost``), or -1/(1 + that ratio) when the plan
  overflows the devices' memory (between a conflict and any plan that fits, faster higher);
  -1 on a conflict.

The search runs in two stages (§5.2.1): from scratch until the greedy policy's plan stops
changing, then a fine-tune whose episodes start from the best plan with its replicated
variables backtracked (those a partition decision of their own does not make conflict,
by their linkage groups). Hyper-parameters: §5.1 (lr 5e-4, epsilon at its floor after 2,000
steps for OPP and 500 for ADP, gamma 0.6, the rest as the pipeline tasks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from ..cluster import Cluster
from .cost import CostModel, PlanCost
from ..errors import PipeplanError
from .decisions import (PARTITION_REWARD, REPLICATE_REWARD, Linkage, Position, decide, decision_order,
                             linkage_groups, partition_mask, placement_rewards, positions, score, vector)
from .program import INPUT, TensorProgram
from .propagate import Domains, Propagator, bit, dim_cuts
from .rules import R
from ..learn.dqn import Agent, Config as DqnConfig, run_episode
from ..learn.harness import Budget, Curve, Point, Progress

CONFLICT_REWARD = -1.0
CHECK_EVERY = 10   # episodes between greedy checks
PATIENCE = 6       # unchanged greedy plans (epsilon at its floor) that end a stage


@dataclass
class Config:
    """§5.1 for the partitioning tasks, and the reward."""

    reward: str = "paper"           # paper | cost
    adp: bool = False               # auto data parallelism: decide input tensors, parameters replicated
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 5e-4
    eps_decay_steps: int = 2000     # OPP: 2,000 iterations; ADP: 500 (§5.1)
    finetune_share: float = 0.4     # of the budget kept for the second stage
    seed: int = 0

    def dqn(self) -> DqnConfig:
        decay = 500 if self.adp and self.eps_decay_steps == 2000 else self.eps_decay_steps
        return DqnConfig(hidden=self.hidden, lr=self.lr, eps_decay_steps=decay, seed=self.seed)


@dataclass
class ShardProblem:
    """A program on N devices: propagation, the positions to decide, their order, prices."""

    prop: Propagator
    start: Domains
    positions: list[Position]
    order: list[int]
    linkage: Linkage
    cost: CostModel | None
    baseline: PlanCost | None
    adp: bool
    costed: bool = False
    replicated: Domains | None = None  # every decided tensor replicated: the baseline's plan

    @classmethod
    def build(cls, prog: TensorProgram, devices: int, cluster: Cluster | None, adp: bool = False,
              costed: bool = False) -> "ShardProblem":
        """``costed`` (ours, ``--hybrid``): a cut tensor may be gathered where a contraction,
        lookup, normalization or the loss needs it whole, and the inputs are decided with the
        parameters (data parallelism where it pays, One Weird Trick's gather before the
        classifier); otherwise the paper's rules: no gathers, OPP keeps the inputs whole."""
        prop = Propagator(prog, devices, inputs_splittable=adp or costed, gathers=costed)
        start, conflict = prop.start()
        if conflict is not None:
            raise PipeplanError(f"model {prog.name!r}: no rule runs it even replicated "
                                f"({prop.describe_conflict(conflict)})")
        if adp:  # data parallelism: every trainable variable replicated
            start, conflict = prop.narrow(start, {t.id: bit(R) for t in prog.params})
        tensors = prog.of_kind(INPUT) if adp else (prog.of_kind(INPUT) + prog.params if costed else prog.params)
        pos = positions(tensors)
        undecided = np.flatnonzero(vector(start, pos) < 0)
        if adp:  # §4.3: "the only difference is that we do not have any linkage groups"
            linkage, order = Linkage({}), [int(i) for i in undecided]
        else:
            linkage = linkage_groups(prop, start, pos)
            order = decision_order(linkage, undecided)
        cost = CostModel(prop, cluster) if cluster is not None else None
        replicated = prop.narrow(start, {t.id: bit(R) for t in tensors})[0]
        baseline = cost.evaluate(replicated) if cost is not None else None
        return cls(prop, start, pos, order, linkage, cost, baseline, adp, costed, replicated)

    def score(self, dom: Domains) -> float:
        """Auto-MAP's reward of a whole plan: +0.4 a partitioned, +0.1 a replicated dimension,
        over the dimensions undecided at the start (what an episode's rewards add up to)."""
        return score(vector(dom, self.positions)[self.order])

    def rewards(self) -> dict[tuple[int, int], float]:
        """The same reward per (tensor, placement), for the integer program."""
        return placement_rewards(self.start, self.positions)

    def value(self, dom: Domains) -> float:
        """The ``cost`` reward of a complete plan: baseline over its step time; overflowing
        memory, -1/(1 + that ratio)."""
        c = self.cost.evaluate(dom)
        ratio = self.baseline.step_s / c.step_s if np.isfinite(c.step_s) and c.step_s > 0 else 0.0
        return ratio if c.fits else -1.0 / (1.0 + ratio)


class ShardEnv(gym.Env):
    """One episode decides every position still undecided, in the linkage order."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, problem: ShardProblem, reward: str = "paper") -> None:
        if reward not in ("paper", "cost") or (reward == "cost" and problem.cost is None):
            raise ValueError(f"reward {reward!r} needs 'paper', or 'cost' with a cluster")
        self.p, self.reward = problem, reward
        n = len(problem.positions)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2 * n,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0 replicate, 1 partition
        self.initial = problem.start
        self.dom: Domains = problem.start
        self.cursor = 0

    def _current(self) -> int | None:
        """The next position of the order still undecided (advancing the cursor)."""
        v = self._vec
        while self.cursor < len(self.p.order) and v[self.p.order[self.cursor]] >= 0:
            self.cursor += 1
        return self.p.order[self.cursor] if self.cursor < len(self.p.order) else None

    def _obs(self) -> tuple[np.ndarray, dict]:
        n = len(self.p.positions)
        here = self._current()
        obs = np.zeros(2 * n, dtype=np.float32)
        obs[:n] = self._vec
        mask = np.zeros(2, dtype=bool)
        if here is not None:
            obs[n + here] = 1.0
            pos = self.p.positions[here]
            m = self.dom[pos.tensor]
            mask[:] = (m & ~dim_cuts(pos.dim)) != 0, partition_mask(m, pos.dim) != 0
        if here is not None and not mask.any():
            raise AssertionError("an undecided position with no valid action")
        return obs, {"action_mask": mask, "position": here}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.dom, self.cursor = self.initial, 0
        self._vec = vector(self.dom, self.p.positions)
        return self._obs()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        here = self._current()
        dom, conflict = decide(self.p.prop, self.dom, self.p.positions[here], bool(action))
        if conflict is not None:
            obs, info = self._obs()
            return obs, CONFLICT_REWARD, True, False, {**info, "conflict": self.p.prop.describe_conflict(conflict)}
        before = self._vec
        self.dom, self._vec = dom, vector(dom, self.p.positions)
        new = (before < 0) & (self._vec >= 0)
        obs, info = self._obs()
        done = info["position"] is None
        if self.reward == "paper":
            reward = PARTITION_REWARD * float((self._vec[new] == 1).sum()) + REPLICATE_REWARD * float(
                (self._vec[new] == 0).sum())
        else:
            reward = self.p.value(self.dom) if done else 0.0
        return obs, reward, done, False, {**info, "complete": done, "domains": self.dom}


@dataclass
class ShardResult:
    """The best plan met (domains), its score and value, when it was met, the stages' figures."""

    domains: Domains
    score: float
    value: float | None
    found_s: float
    elapsed_s: float
    episodes: int
    conflicts: int
    stage1_s: float
    curve: Curve


def _objective(problem: ShardProblem, dom: Domains, reward: str) -> float:
    return problem.score(dom) if reward == "paper" else problem.value(dom)


def _backtracked(problem: ShardProblem, best: Domains) -> Domains:
    """§5.2.1's second stage starts from the best plan with its replicated variables undecided
    again, where a partition of their own is not a conflict by their linkage groups."""
    v = vector(best, problem.positions)
    keep: dict[int, int] = {}
    forced, open_ = problem.linkage.forced, set(problem.order)
    for i, pos in enumerate(problem.positions):
        if v[i] == 1:
            keep[pos.tensor] = best[pos.tensor]  # its one cut, plain or strided
        elif v[i] == 0 and (i not in open_ or ((i, True) in forced and forced[(i, True)] is None)):
            keep[pos.tensor] = keep.get(pos.tensor, ~0) & ~dim_cuts(pos.dim)
    dom, conflict = problem.prop.narrow(problem.start, keep)
    return problem.start if conflict is not None else dom


def search(problem: ShardProblem, budget: Budget, cfg: Config | None = None,
           progress: Progress | None = None) -> ShardResult:
    """The two-stage DQN search (§5.2.1) within ``budget``; returns the best complete plan met."""
    import torch

    torch.set_num_threads(1)
    cfg = cfg or Config()
    if not problem.order:  # propagation alone decided everything: nothing to learn
        value = problem.value(problem.start) if problem.cost is not None else None
        return ShardResult(problem.start, problem.score(problem.start), value, 0.0, budget.elapsed, 0, 0, 0.0,
                           Curve())
    env = ShardEnv(problem, cfg.reward)
    agent = Agent(env.observation_space.shape[0], 2, cfg.dqn())
    curve = Curve(f"episode return ({cfg.reward} reward, last {CHECK_EVERY})", "greedy policy's return", "episode")
    best: tuple[float, Domains | None, float] = (-np.inf, None, 0.0)
    episodes = conflicts = 0
    returns: list[float] = []
    stage1_s = None
    greedy_prev, streak = None, 0
    while budget.left(episodes):
        ret, _, info = run_episode(env, agent)
        episodes += 1
        returns.append(ret)
        conflicts += "conflict" in info
        if info.get("complete"):
            obj = _objective(problem, info["domains"], cfg.reward)
            if obj > best[0]:
                best = (obj, info["domains"], budget.elapsed)
        if episodes % CHECK_EVERY:
            continue
        g_ret, g_actions, _ = run_episode(env, agent, explore=False, learn=False)
        streak = streak + 1 if g_actions == greedy_prev and agent.epsilon <= agent.cfg.eps_end + 1e-9 else 0
        greedy_prev = g_actions
        curve.add(Point(episodes, budget.elapsed, episodes, float(np.mean(returns[-CHECK_EVERY:])), g_ret,
                        -best[0]))
        if progress is not None:
            progress(curve.points[-1], budget.fraction(episodes))
        if stage1_s is None and best[1] is not None and (streak >= PATIENCE or
                                                     budget.fraction(episodes) > 1 - cfg.finetune_share):
            stage1_s = budget.elapsed  # §5.2.1: stable: backtrack and fine-tune
            env.initial = _backtracked(problem, best[1])
            agent.steps, streak = 0, 0
            if (vector(env.initial, problem.positions) >= 0).all():
                break  # nothing to backtrack
        elif stage1_s is not None and streak >= PATIENCE:
            break
    if best[1] is None:
        raise PipeplanError(f"no episode completed a plan in {episodes} episodes ({conflicts} conflicts): give the "
                            "search more --episodes")
    value = problem.value(best[1]) if problem.cost is not None else None
    return ShardResult(best[1], problem.score(best[1]), value, best[2], budget.elapsed, episodes, conflicts,
                       stage1_s if stage1_s is not None else budget.elapsed, curve)
