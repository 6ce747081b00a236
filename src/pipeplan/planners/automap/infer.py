"""Auto-MAP's pipeline planning by online inference (auto-map.txt §3.5, §4.5): a DQN trained
once on generated array-partition problems, then asked for any model zero-shot.

Training data (§4.5.1 "Data Generation", ``training_data.py``): generated arrays and the zoo's
training models on random clusters (``wide``: with LLMs, random graphs and up to 512 GPUs);
each instance is played ``EPISODES_PER_INSTANCE`` = 50 times (§3.5.3).

State (§4.5.2): C*, A*, W*, the topology matrix and the partition so far, arranged per
action (``InferEnv``): each of the 128 actions gets a row of features computed from those
inputs, and one small network scores every row (``learn.dqn.PointwiseQ``). The paper's
flat layout (the arrays, the padded 32 x 32 matrix and the marks side by side into an MLP)
learned no input-dependent plan in 100,000 episodes here (docs/automap.md).
Actions (§4.5.2): partition boundaries and device cuts share one action space of 128: the
steps alternate, boundary j then device cut j. Reward: 1/L at the last step (L in units of
the instance's ideal iteration, as online), shaped by an optimistic bound of the partial plan
(``InferEnv.potential``). Planning: the greedy policy (§3.5.3) or, beyond the paper, a beam of
the agent's best partial plans whose complete plans V scores (``beam``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ...errors import PipeplanError
from .arrays import MAX_DEVICES, MAX_STAGES, POINTS, Instance
from .policy import NumpyQ, Policy, load_twin, torch_policy
from .training_data import generated, sampler

if TYPE_CHECKING:
    from ...learn.dqn import Config

EPISODES_PER_INSTANCE = 50      # §3.5.3
SHIPPED = Path(__file__).with_name("automap-infer.pt")


# -- environment ---------------------------------------------------------------------------------
FEATURES = 8       # per action (point or device), see InferEnv.rows
GLOBALS = 5


def _clip(x: np.ndarray) -> np.ndarray:
    return np.clip(x, 0.0, 4.0) / 4.0


def _inner_min(top: np.ndarray, a: int) -> np.ndarray:
    """``out[i]``: the least entry of ``top[a:a+i+1, a:a+i+1]`` (the slowest link among GPUs a..a+i)."""
    t = top[a:, a:]
    upper = np.triu(np.ones(t.shape, dtype=bool))
    edge = np.minimum(np.where(upper, t, np.inf).min(axis=0), np.where(upper.T, t, np.inf).min(axis=1))
    return np.minimum.accumulate(edge)


class InferEnv:
    """One episode = K-1 boundaries and K-1 device cuts of one instance, alternating.

    The observation holds what §4.5.2 lists (C*, A*, W*, the topology, the partition so far)
    arranged per action: a row of ``FEATURES`` numbers for each of the 128 actions, computed
    from those inputs, then ``GLOBALS`` numbers. Boundary at point i (stage j closes there):
    the stage's compute share and the mean share left to each later stage (both x K), the
    activation crossing i over the stage's compute, the stage's and the rest's parameter
    shares. Device cut at d (stage j gets units [d_prev, d) of ``inst.unit`` GPUs, one GPU up
    to 32, whole servers beyond; shares below count GPUs): its device share over its
    compute share, the same for the rest, its all-reduce time over the ideal iteration, how
    much slower its slowest inner link is than the fastest, whether d is on a server
    boundary, its per-device compute over the ideal. Last column: the action is valid.
    Globals: boundary or device step, the step, K/8, N/32, log2(M)/6. ``min_share`` (planning,
    not training): a boundary leaving a stage, or the stages after it, less than that share of
    an equal share of the compute each is masked (where any other is left).
    """

    metadata: dict[str, Any] = {"render_modes": []}
    OBS = POINTS * FEATURES + GLOBALS

    def __init__(self, sample: Callable[[], Instance] | None = None, gamma: float | None = None,
                 min_share: float = 0.0) -> None:
        self.sample, self.min_share = sample, min_share
        self.inst: Instance | None = None
        self.played = 0
        self.cache: dict[tuple, float] = {}
        self.gamma = gamma  # the agent's discount: rewards are shaped with it (None: not shaped)

    def use(self, inst: Instance) -> None:
        if inst.stages > MAX_STAGES:
            raise PipeplanError(f"automap-infer: {inst.stages} stages; the agent plans up to {MAX_STAGES}")
        self.inst, self.played, self.cache = inst, 0, {}
        self.frac = inst.C / inst.C[-1] if inst.C[-1] > 0 else np.linspace(0, 1, POINTS)
        self.wfrac = inst.W / inst.W[-1] if inst.W[-1] > 0 else np.zeros(POINTS)

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
            if self.min_share > 0:  # no stage below min_share of an equal share of the compute
                least = self.min_share / inst.stages
                roomy = ok & (self.frac - self.frac[last] >= least) & (1 - self.frac >= (inst.stages - 1 - j) * least)
                ok = roomy if roomy.any() else ok
        else:
            last = self.dcuts[-1] if self.dcuts else 0
            d = np.arange(POINTS)
            ok = (d > last) & (d <= inst.units - (inst.stages - 1 - j))
        return ok

    def ideal(self) -> float:
        return self.inst.microbatches * self.inst.C[-1] / self.inst.devices

    def rows(self, valid: np.ndarray) -> np.ndarray:
        """The per-action features of the current step (see the class docstring)."""
        inst, k, j = self.inst, self.inst.stages, len(self.dcuts)
        f = np.zeros((POINTS, FEATURES))
        if len(self.bounds) == len(self.dcuts):  # boundary j
            p = self.bounds[-1] if self.bounds else 0
            share = self.frac - self.frac[p]
            f[:, 0] = _clip(share * k)
            f[:, 1] = _clip((1 - self.frac) * k / max(1, k - 1 - j))
            f[:, 2] = _clip(inst.A / np.maximum(inst.C - inst.C[p], 1e-12))
            f[:, 3] = self.wfrac - self.wfrac[p]
            f[:, 4] = 1 - self.wfrac
        else:  # device cut j, for the stage closed at bounds[j]
            f[:, :6] = self._device_rows(j)
        f[:, 7] = valid
        return f * valid[:, None]

    def _device_rows(self, j: int) -> np.ndarray:
        """Device cut d (in units of ``inst.unit`` GPUs; GPU counts below are in GPUs)."""
        inst, n_dev, u = self.inst, self.inst.devices, self.inst.unit
        start = self.bounds[j - 1] if j else 0
        g_prev = (self.dcuts[-1] if self.dcuts else 0) * u
        share, rest = self.frac[self.bounds[j]] - self.frac[start], 1 - self.frac[self.bounds[j]]
        w_stage = inst.W[self.bounds[j]] - inst.W[start]
        out = np.zeros((POINTS, 6))
        d = np.arange(g_prev // u + 1, inst.units)
        if not d.size:
            return out
        g = d * u
        n = g - g_prev
        inner = _inner_min(inst.topology, g_prev)[g - 1 - g_prev]  # slowest link among GPUs g_prev..g-1
        ar = np.where(n > 1, 2 * (n - 1) / n * w_stage / inner, 0.0)
        out[d] = np.stack([_clip((n / n_dev) / max(share, 1e-12)), _clip(((n_dev - g) / n_dev) / max(rest, 1e-12)),
                           _clip(ar / self.ideal()), 1 - inner, (inst.topology[g - 1, g] < 1).astype(float),
                           _clip(inst.microbatches * (share * inst.C[-1]) / n / self.ideal())], axis=1)
        return out

    def _obs(self) -> tuple[np.ndarray, dict]:
        inst = self.inst
        k = len(self.bounds) + len(self.dcuts)
        valid = self.mask()
        glob = [float(len(self.bounds) == len(self.dcuts)), k / (2 * (MAX_STAGES - 1)), inst.stages / MAX_STAGES,
                inst.units / MAX_DEVICES, np.log2(inst.microbatches) / 6.0]
        obs = np.concatenate([self.rows(valid).ravel(), glob]).astype(np.float32)
        return obs, {"action_mask": valid, "bounds": list(self.bounds), "dcuts": list(self.dcuts)}

    @property
    def observation_space(self):
        """gymnasium's Box of the observations (gymnasium imported when asked: planning needs
        none of it)."""
        from gymnasium.spaces import Box

        return Box(0.0, 1.0, shape=(self.OBS,), dtype=np.float32)

    @property
    def action_space(self):
        from gymnasium.spaces import Discrete

        return Discrete(POINTS)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """A new episode (gymnasium's ``Env.reset``; ``seed`` unused: instances come from the
        sampler's own generator)."""
        if self.sample is not None and (self.inst is None or self.played >= EPISODES_PER_INSTANCE):
            self.use(self.sample())
        self.played += 1
        self.bounds, self.dcuts = [], []
        return self._obs()

    def load(self, bounds: list[int], dcuts: list[int]) -> tuple[np.ndarray, dict]:
        """Put the episode in the state of a partial plan (beam search); its observation."""
        self.bounds, self.dcuts = list(bounds), list(dcuts)
        return self._obs()

    def value(self, bounds: list[int], dcuts: list[int]) -> float:
        key = (*bounds, -1, *dcuts)
        if key not in self.cache:
            self.cache[key] = float(self.inst.values(np.asarray([bounds]), np.asarray([dcuts]))[0])
        return self.cache[key]

    def bound(self) -> float:
        """An optimistic bound on what the partial plan can still reach, as ideal/L: each
        closed stage's compute over its devices plus its all-reduce, the open stage's compute
        over the most devices it can get, the rest over the devices left (M microbatches)."""
        inst, m, n_dev = self.inst, self.inst.microbatches, self.inst.devices
        c, w, k = inst.C, inst.W, inst.stages
        edges, devs = [0, *self.bounds], [0, *[d * inst.unit for d in self.dcuts]]
        worst = self.ideal()
        for s in range(len(self.dcuts)):
            a, b = devs[s], devs[s + 1]
            ar = 2 * (b - a - 1) / (b - a) / inst.topology[a:b, a:b].min() if b - a > 1 else 0.0
            worst = max(worst, m * (c[edges[s + 1]] - c[edges[s]]) / (b - a) + (w[edges[s + 1]] - w[edges[s]]) * ar)
        open_stage = len(self.bounds) > len(self.dcuts)
        if open_stage:
            room = n_dev - devs[-1] - (k - 1 - len(self.dcuts)) * inst.unit
            worst = max(worst, m * (c[edges[-1]] - c[edges[-2]]) / room)
        worst = max(worst, m * (c[-1] - c[edges[-1]]) / (n_dev - devs[-1] - open_stage * inst.unit))
        return self.ideal() / worst

    def potential(self, gamma: float) -> float:
        """Φ for reward shaping (Ng et al. 1999; ours, docs/automap.md): the bound scaled by
        the discount the final reward will have, so shaped Q-values stay near zero."""
        left = 2 * (self.inst.stages - 1) - len(self.bounds) - len(self.dcuts)
        return gamma ** (left - 1) * self.bound() if left > 0 else 0.0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        before = self.potential(self.gamma) if self.gamma else 0.0
        (self.bounds if len(self.bounds) == len(self.dcuts) else self.dcuts).append(int(action))
        done = len(self.dcuts) == self.inst.stages - 1
        obs, info = self._obs()
        reward = self.gamma * self.potential(self.gamma) - before if self.gamma else 0.0
        if done:
            length = self.value(self.bounds, self.dcuts)
            ratio = self.ideal() / length if np.isfinite(length) and length > 0 else -1.0
            reward += ratio
            info.update(value=length, ratio=ratio)
        return obs, reward, done, False, info


@dataclass
class Inferred:
    """A plan of an instance: boundaries (points), device cuts, its value, time to plan."""

    bounds: list[int]
    dcuts: list[int]
    value: float
    seconds: float


# -- the agent: training once, planning zero-shot ------------------------------------------------
AGENT = "automap-infer"
CHECK_EVERY = 500   # episodes between learning-curve points
VALIDATION = 16     # generated instances the greedy policy is scored on at each point


def config(seed: int = 0) -> "Config":
    """§5.1's pipeline hyper-parameters but gamma 1 (ours: with 0.6 the first of 2(K-1) steps
    sees 0.6^(2K-3) of the one final reward, and agents learned to cut every model near its
    end; docs/automap.md); the network is ours (``PointwiseQ``: two hidden layers of 64 applied
    to every action's row), and the agent learns every 4 steps (CleanRL's train_frequency) to
    afford many episodes."""
    from ...learn.dqn import Config

    return Config(hidden=(64, 64), train_every=4, point_features=FEATURES, seed=seed, gamma=1.0)


def greedy(agent: Policy, env: InferEnv, inst: Instance) -> Inferred:
    """The agent's plan for ``inst``: every step the valid action of largest Q (§3.5.3)."""
    return beam(agent, env, inst, 1)


def beam(agent: Policy, env: InferEnv, inst: Instance, width: int) -> Inferred:
    """Beyond the paper: the agent's best actions kept as a beam of ``width`` partial plans,
    ranked by the agent's estimate of their final reward (Q plus the shaping potential Φ of
    the state, which the shaped Q leaves out); V scores the complete plans and the best is
    returned. ``width`` 1 is §3.5.3's greedy plan."""
    import time

    t0 = time.perf_counter()
    env.use(inst)
    states: list[tuple[list[int], list[int]]] = [([], [])]
    for _ in range(2 * (inst.stages - 1)):
        seen, potential = [], []
        for b, d in states:
            seen.append(env.load(b, d))
            potential.append(env.potential(agent.gamma))
        q = agent.q(np.stack([o for o, _ in seen]))
        q = np.where(np.stack([i["action_mask"] for _, i in seen]), q, -np.inf)  # §4.4: invalid actions
        score = q + np.array(potential)[:, None]
        states = _best(states, score, inst.positions, width)
    values = inst.values(np.array([b for b, _ in states]), np.array([d for _, d in states]))
    i = int(np.argmin(values))
    return Inferred(states[i][0], states[i][1], float(values[i]), time.perf_counter() - t0)


def _best(states: list[tuple[list[int], list[int]]], score: np.ndarray, positions: np.ndarray,
          width: int) -> list[tuple[list[int], list[int]]]:
    """The ``width`` best extensions of ``states`` by ``score`` (states x actions, -inf where
    invalid), each plan once: boundaries at points of the same real position are one plan."""
    out, seen = [], set()
    for flat in np.argsort(-score, axis=None, kind="stable"):
        i, a = divmod(int(flat), score.shape[1])
        if len(out) == width or not np.isfinite(score[i, a]):
            break
        new = _extend(states[i], a)
        key = (tuple(positions[new[0]].tolist()), tuple(new[1]))
        if key not in seen:
            seen.add(key)
            out.append(new)
    return out


def _extend(state: tuple[list[int], list[int]], action: int) -> tuple[list[int], list[int]]:
    bounds, dcuts = state
    return (bounds + [action], dcuts) if len(bounds) == len(dcuts) else (bounds, dcuts + [action])


@dataclass
class Trained:
    agent: Any
    curve: Any
    checkpoint: dict
    episodes: int


def train(budget, seed: int = 0, data: str = "mix", init: str | None = None, progress=None,
          command: str = "") -> Trained:
    """Train on instances drawn from ``data`` until ``budget`` (episodes count as
    evaluations); from the checkpoint ``init`` (fine-tuning: epsilon starts at its floor)."""
    import torch

    from ...learn.dqn import Agent, run_episode
    from ...learn.harness import Curve, Point, checkpoint, seed_everything

    torch.set_num_threads(1)
    seed_everything(seed)
    rng = np.random.default_rng(seed)
    agent = Agent(InferEnv.OBS, POINTS, config(seed))
    if init:
        load_weights(agent, init)
        agent.steps = agent.cfg.eps_decay_steps
    env, probe = InferEnv(sampler(rng, data), agent.cfg.gamma), InferEnv()
    val_rng = np.random.default_rng(10_000 + seed)
    validation = [generated(val_rng, wide=data == "wide") for _ in range(VALIDATION)]
    curve = Curve("mean reward (ideal/L, last 500 episodes)", "greedy reward on 16 held-out instances", "episode")
    episodes, returns = 0, []
    while budget.left(episodes):
        _, _, info = run_episode(env, agent)
        episodes += 1
        returns.append(info["ratio"])
        if episodes % CHECK_EVERY == 0 or not budget.left(episodes):  # and a last point where it stops
            policy = torch_policy(agent.online, agent.cfg.gamma)
            val = np.mean([_ratio(probe, greedy(policy, probe, v)) for v in validation])
            curve.add(Point(episodes, budget.elapsed, episodes, float(np.mean(returns[-CHECK_EVERY:])), float(val),
                            float("nan")))
            if progress is not None:
                progress(curve.points[-1], budget.fraction(episodes))
    state = {k: v.detach().half() for k, v in agent.online.state_dict().items()}  # fp16: a small file
    trained_on = {"data": data, "episodes": episodes, "seconds": budget.elapsed, "seed": seed, "from": init,
                  "command": command}
    return Trained(agent, curve, checkpoint(AGENT, agent.cfg, state, trained_on), episodes)


def _ratio(env: InferEnv, plan: Inferred) -> float:
    """The reward of a plan: its instance's ideal iteration over its value."""
    return env.ideal() / plan.value if np.isfinite(plan.value) and plan.value > 0 else 0.0


def _checked(path: str | Path, cfg: "Config") -> dict:
    """A checkpoint's contents, its weights checked against the network ``cfg`` builds."""
    from ...learn.dqn import q_network
    from ...learn.harness import check_state, load_checkpoint

    data = load_checkpoint(str(path), AGENT)
    check_state(data["state"], lambda: q_network(InferEnv.OBS, POINTS, cfg), str(path))
    return data


def load_weights(agent, path: str | Path) -> dict:
    """Load a checkpoint's weights into a training ``agent`` (online and target)."""
    data = _checked(path, agent.cfg)
    agent.online.load_state_dict({k: v.float() for k, v in data["state"].items()})
    agent.target.load_state_dict(agent.online.state_dict())
    return data


def load_agent(path: str | Path | None = None) -> Policy:
    """The policy of a checkpoint (default: the one shipped with pipeplan), loaded once a
    process for each version of the file (its size and modification time): from its numpy
    twin when the twin was made from these very bytes (no torch), else from the checkpoint
    through torch; either way the network runs in numpy (``policy.py``)."""
    from ...readers import regular_file

    path = Path(path) if path else SHIPPED
    if path == SHIPPED and not path.is_file():
        raise PipeplanError(f"automap-infer: checkpoint {str(path)!r}: no such file (rebuild it: see docs/automap.md)")
    st = regular_file(path, "checkpoint").stat()
    return _policy(str(path), st.st_mtime_ns, st.st_size)


def agent_loads() -> int:
    """How many checkpoints this process has loaded (each version of a file once)."""
    return _policy.cache_info().misses


@lru_cache(maxsize=4)
def _policy(path: str, mtime_ns: int, size: int) -> Policy:
    found = load_twin(Path(path), POINTS, FEATURES, InferEnv.OBS)
    if found is not None:
        return found
    cfg = config()
    data = _checked(path, cfg)
    return Policy(NumpyQ({k: v.float().numpy() for k, v in data["state"].items()}, POINTS, FEATURES), cfg.gamma)
