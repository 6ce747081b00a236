"""DRL-PP (drl-pp.txt): a PPO agent that partitions a model's DAG and places the partitions.

One module, top to bottom: the hyper-parameters (``Config``), the agent (graph encoder §3.1,
recurrent partitioner §3.2 / Algorithm 1, pipeline scheduler §3.3, and beyond the paper an
execution head choosing the schedule and replica mode), how it samples a plan, and the PPO
loop that trains the parts jointly (§3.4). Choices the paper leaves open
are in ``Config`` and in docs/drlpp.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ...cluster import Cluster
from ...errors import PipeplanError
from ...graph import Graph
from ...learn.features import NODE_FEATURES, adjacency, node_features
from ...learn.found import trivial_name, trivial_under
from ...learn.gcn import GraphEncoder
from ...learn.harness import Budget, Curve, Point, Progress, seed_everything
from ...learn.partition import Ancestors, PartitionState, placement_valid
from ...learn.scoring import EXECUTIONS, Scorer


@dataclass(frozen=True)
class Config:
    # the agent (§4.2)
    gcn_widths: tuple[int, ...] = (32, 64, 128)
    hidden: int = 128  # LSTM and MLP units
    accelerator_embedding: int = 128
    # T of Algorithm 1: the cut action's score is lowered by T (docs/drlpp.md); None: ln(nodes /
    # accelerators), so that an untrained agent's partitions of a chain hold about nodes / accelerators
    temperature: float | None = None
    # sampling (§3.4): placements per partition scheme; invalid placements drawn again (§3.3)
    schemes_per_update: int = 8
    placements_per_scheme: int = 4
    resample_rounds: int = 4
    # PPO (Schulman et al. 2017); the paper gives none of these
    learning_rate: float = 1e-3
    epochs: int = 4
    clip: float = 0.2
    entropy_coef: float = 0.05  # at the start of training, annealed geometrically to entropy_final (no collapse)
    entropy_final: float = 0.005
    baseline_decay: float = 0.9  # the moving baseline: an average of the schemes' rewards
    max_grad_norm: float = 1.0
    seed: int = 0
    # against the collapse to data parallelism (docs/drlpp.md, issue 44): a scheme's reward the
    # best of its placements' ("best") or their mean (§3.4, "mean"); advantages against the
    # batch's mean ("batch") or the moving baseline over a floored spread (before, "moving")
    scheme_reward: str = "best"
    baseline: str = "batch"

    def __post_init__(self) -> None:
        if self.scheme_reward not in ("best", "mean") or self.baseline not in ("batch", "moving"):
            raise PipeplanError(f"drl-pp config: scheme_reward must be best or mean and baseline batch or moving, got "
                                f"{self.scheme_reward!r} and {self.baseline!r}")


PLACEMENT_FEATURES = 3


# -- the agent -------------------------------------------------------------------------------

def _mlp(inputs: int, hidden: int) -> nn.Sequential:
    """A one-hidden-layer perceptron giving one score."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class Agent(nn.Module):
    """Graph encoder, graph cutter and candidate selector (Alg. 1), pipeline scheduler."""

    def __init__(self, cfg: Config, devices: int) -> None:
        super().__init__()
        width = cfg.gcn_widths[-1]
        self.cfg, self.devices = cfg, devices
        self.encoder = GraphEncoder(NODE_FEATURES, cfg.gcn_widths)
        self.cutter = nn.LSTMCell(width, cfg.hidden)  # encodes partition summaries (line 13)
        self.selector = nn.LSTMCell(width, cfg.hidden)  # reads a partition's nodes, then a candidate
        self.cut_score = _mlp(cfg.hidden, cfg.hidden)  # S_{G_k} (line 14)
        self.candidate_score = _mlp(cfg.hidden, cfg.hidden)  # S_{v_i} (line 15)
        self.accelerators = nn.Embedding(devices, cfg.accelerator_embedding)  # §3.3
        self.pair_score = _mlp(width + cfg.accelerator_embedding, cfg.hidden)
        # beyond the paper: the schedule and replica mode, read from the graph and the placement
        self.execution_score = nn.Sequential(nn.Linear(width + PLACEMENT_FEATURES, cfg.hidden), nn.ReLU(),
                                             nn.Linear(cfg.hidden, len(EXECUTIONS)))


@dataclass
class Scheme:
    """One partition scheme and the placements sampled for it."""

    trajectory: Trajectory  # Algorithm 1's steps
    part: np.ndarray
    placements: list[np.ndarray] = field(default_factory=list)
    placement_logp: list[float] = field(default_factory=list)  # the placement's and its execution's
    executions: list[int] = field(default_factory=list)  # per placement: an index into the instance's executions
    rewards: list[float] = field(default_factory=list)  # per placement (penalty if invalid)
    valid: list[bool] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # predicted iteration time per placement
    best: bool = True  # its reward: the best valid placement's (else their mean, §3.4)

    @property
    def reward(self) -> float:
        """The best reward of its valid placements (§3.4 takes their mean; docs/drlpp.md: with
        an untrained scheduler the mean punishes every pipeline for the placements' noise,
        which data parallelism, one placement only, never pays, and the partitioner collapsed
        to it); the worst when none is valid."""
        ok = [r for r, v in zip(self.rewards, self.valid) if v]
        return float((np.max if self.best else np.mean)(ok)) if ok else min(self.rewards)


# -- Algorithm 1: the recurrent partitioner ---------------------------------------------------

@dataclass
class Step:
    """One step of Algorithm 1 as taken: partition ``k`` held ``joined`` nodes; ``starting``:
    it picked the partition's first node (no cut offered); ``grows``: cutter steps before it;
    ``candidates``: V_c; ``choice``: the index taken among [cut] + candidates (or candidates)."""

    k: int
    joined: int
    starting: bool
    grows: int
    candidates: np.ndarray
    choice: int
    logp: float  # of the choice, when it was sampled


@dataclass
class Trajectory:
    """Algorithm 1's steps on one scheme and each partition's nodes in the order they joined."""

    steps: list[Step]
    orders: list[list[int]]
    temperature: float


def walk(agent: Agent, h: torch.Tensor, state: PartitionState, generator: torch.Generator | None = None,
         cells: _Cells | None = None) -> tuple[Trajectory, float]:
    """Sample Algorithm 1 on ``state`` (no gradients); the trajectory and its log-probability.

    The cutter LSTM reads the current partition's summary (the sum of its nodes'
    representations) at every step that may cut, starting from zeros (line 1); the selector
    LSTM starts each partition from the cutter's encoding of the previous one (H~_{G_{k-1}}),
    reads the partition's nodes in the order they joined, and scores each candidate as one
    more step (line 15). The cut's score is the current partition's score minus T (lines
    9-14; docs/drlpp.md). ``replay`` recomputes the same figures in a few batched calls, with
    gradients; here the same cells run in numpy (``_Cells``: a step costs microseconds, not a
    torch call's overhead a gate; ``cells``: made once for many walks)."""
    cfg, n = agent.cfg, state.actions.nodes
    temperature = cut_temperature(cfg, n, state.devices)
    net = cells or _Cells(agent, h)
    zero = np.zeros(cfg.hidden, dtype=np.float32)
    cut_state, sel_state, summary = (zero, zero), (zero, zero), np.zeros(h.shape[1], dtype=np.float32)
    fed, grows, steps, logp = 0, 0, [], 0.0
    while state.partitioning:
        cand = np.flatnonzero(state.candidates())
        joined = int((state.part == state.k).sum())
        if state.starting:  # a new partition: the selector starts from H~_{G_{k-1}}
            sel_state, fed, summary = cut_state, len(state.added), np.zeros_like(summary)
        else:
            for u in state.added[fed:]:
                sel_state = net.select(net.sel_x[u], sel_state)
                summary = summary + net.h[u]
            fed = len(state.added)
            cut_state = net.cut(summary, cut_state)
            grows += 1
        scores = net.candidate_scores(cand, sel_state)
        if not state.starting:
            scores = np.concatenate([[net.cut_score(cut_state[0]) - temperature], scores])
        logp_all = scores - scores.max()
        logp_all = logp_all - np.log(np.exp(logp_all).sum())
        i = int(torch.multinomial(torch.from_numpy(np.exp(logp_all)), 1, generator=generator))
        logp += float(logp_all[i])
        steps.append(Step(state.k, joined, state.starting, grows - (0 if state.starting else 1), cand, i,
                          float(logp_all[i])))
        state.step(n if (not state.starting and i == 0) else int(cand[i - (0 if state.starting else 1)]))
    orders = [[u for u in state.added if state.part[u] == k] for k in range(state.num_partitions)]
    return Trajectory(steps, orders, temperature), logp


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


class _Cells:
    """The partitioner's LSTM cells and score MLPs as numpy arrays, for ``walk`` (torch's
    ``LSTMCell``: gates i, f, g, o from x W_ih^T + b_ih + h W_hh^T + b_hh). The selector's
    inputs are node representations, so their projections are computed once for all nodes."""

    def __init__(self, agent: Agent, h: torch.Tensor) -> None:
        def arr(t: torch.Tensor) -> np.ndarray:
            return t.detach().numpy().astype(np.float32)

        sel, cut = agent.selector, agent.cutter
        self.h = arr(h)
        self.sel_x = self.h @ arr(sel.weight_ih).T + arr(sel.bias_ih + sel.bias_hh)  # (nodes, 4 hidden)
        self.sel_hh = arr(sel.weight_hh).T
        self.cut_ih, self.cut_hh, self.cut_b = arr(cut.weight_ih).T, arr(cut.weight_hh).T, arr(cut.bias_ih + cut.bias_hh)
        self.cand_mlp = [arr(t) for t in (agent.candidate_score[0].weight.T, agent.candidate_score[0].bias,
                                          agent.candidate_score[2].weight.T, agent.candidate_score[2].bias)]
        self.cut_mlp = [arr(t) for t in (agent.cut_score[0].weight.T, agent.cut_score[0].bias,
                                         agent.cut_score[2].weight.T, agent.cut_score[2].bias)]

    @staticmethod
    def _cell(gates: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = gates.shape[-1] // 4
        sig = _sigmoid(gates)
        c = sig[..., k:2 * k] * c + sig[..., :k] * np.tanh(gates[..., 2 * k:3 * k])
        return sig[..., 3 * k:] * np.tanh(c), c

    def select(self, x_projected: np.ndarray, state: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return self._cell(x_projected + state[0] @ self.sel_hh, state[1])

    def cut(self, x: np.ndarray, state: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return self._cell(x @ self.cut_ih + self.cut_b + state[0] @ self.cut_hh, state[1])

    @staticmethod
    def _mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
        return (np.maximum(x @ w1 + b1, 0.0) @ w2 + b2)[..., 0]

    def candidate_scores(self, cand: np.ndarray, state: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Each candidate read as one more selector step from ``state``, scored."""
        hc, _ = self.select(self.sel_x[cand], state)
        return self._mlp(hc, *self.cand_mlp).astype(np.float64)

    def cut_score(self, cut_h: np.ndarray) -> float:
        return float(self._mlp(cut_h, *self.cut_mlp))


def cut_temperature(cfg: Config, nodes: int, devices: int) -> float:
    """T (Algorithm 1): ``cfg.temperature``, else ln(nodes / accelerators), at least 0."""
    return cfg.temperature if cfg.temperature is not None else math.log(max(nodes / max(devices, 1), 1.0))


def replay(agent: Agent, h: torch.Tensor, trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every step's log-probability and entropy under the agent now (with gradients), and
    the trajectory each step belongs to: the figures of ``walk``, batched over trajectories
    and steps (one LSTM call per time step of the longest sequence, one for every candidate
    of every step)."""
    if not any(tr.steps for tr in trajs):  # one device: nothing was chosen
        return h.new_zeros(0), h.new_zeros(0), torch.zeros(0, dtype=torch.long)
    cut_h, cut_c, cut_at = _cutter_states(agent, h, trajs)
    sel_h, sel_c, sel_at = _selector_states(agent, h, trajs, cut_h, cut_c, cut_at)
    rows, cands, nodes, traj_of = [], [], [], []
    for t, tr in enumerate(trajs):
        for st in tr.steps:
            rows.append(sel_at[(t, st.k)] + st.joined)
            cands.append(len(st.candidates))
            nodes.extend(st.candidates.tolist())
            traj_of.append(t)
    rows_t = torch.as_tensor(np.repeat(rows, cands))
    hc = agent.selector(h[torch.as_tensor(nodes)], (sel_h[rows_t], sel_c[rows_t]))
    cand_scores = agent.candidate_score(hc[0]).squeeze(1)
    steps = [st for tr in trajs for st in tr.steps]
    width = max(cands) + 1
    logits = torch.full((len(steps), width), -torch.inf, dtype=h.dtype)
    offset = torch.as_tensor([0 if st.starting else 1 for st in steps])
    col = torch.as_tensor(np.concatenate([np.arange(c) for c in cands])) + torch.repeat_interleave(
        offset, torch.as_tensor(cands))
    logits[torch.repeat_interleave(torch.arange(len(steps)), torch.as_tensor(cands)), col] = cand_scores
    grow = [j for j, st in enumerate(steps) if not st.starting]
    if grow:
        at = torch.as_tensor([cut_at[traj_of[j]] + steps[j].grows + 1 for j in grow])
        temperature = torch.as_tensor([trajs[traj_of[j]].temperature for j in grow], dtype=h.dtype)
        logits[torch.as_tensor(grow), 0] = agent.cut_score(cut_h[at]).squeeze(1) - temperature
    logp_all = torch.log_softmax(logits, dim=1)
    chosen = logp_all[torch.arange(len(steps)), torch.as_tensor([st.choice for st in steps])]
    probs = logp_all.exp()
    entropy = -(probs * torch.where(probs > 0, logp_all, torch.zeros_like(logp_all))).sum(1)
    return chosen, entropy, torch.as_tensor(traj_of)


def _cutter_states(agent: Agent, h: torch.Tensor, trajs: list[Trajectory]):
    """The cutter's (h, c) after each grow step of each trajectory, stacked: trajectory t's
    state after g grow steps is row ``at[t] + g`` (row ``at[t]``: zeros)."""
    cfg = agent.cfg
    summaries = []
    for tr in trajs:
        sums = [h[torch.as_tensor(order)].cumsum(0) for order in tr.orders]  # row j - 1: the first j nodes
        seq = [sums[st.k][st.joined - 1] if st.joined else h.new_zeros(h.shape[1])
               for st in tr.steps if not st.starting]
        summaries.append(torch.stack(seq) if seq else h.new_zeros(0, h.shape[1]))
    length = max(len(s) for s in summaries)
    x = h.new_zeros(len(trajs), max(length, 1), h.shape[1])
    for t, s in enumerate(summaries):
        x[t, :len(s)] = s
    hs, cs = [h.new_zeros(len(trajs), cfg.hidden)], [h.new_zeros(len(trajs), cfg.hidden)]
    for g in range(length):
        nh, nc = agent.cutter(x[:, g], (hs[-1], cs[-1]))
        hs.append(nh)
        cs.append(nc)
    hh, cc = torch.stack(hs, 1), torch.stack(cs, 1)  # (trajs, length + 1, hidden)
    at = [t * (length + 1) for t in range(len(trajs))]
    return hh.reshape(-1, cfg.hidden), cc.reshape(-1, cfg.hidden), at


def _selector_states(agent: Agent, h: torch.Tensor, trajs: list[Trajectory], cut_h, cut_c, cut_at):
    """The selector's (h, c) after j nodes of each partition of each trajectory, stacked:
    row ``at[(t, k)] + j``; it starts from the cutter's state when the partition began."""
    cfg = agent.cfg
    pairs, init = [], []
    for t, tr in enumerate(trajs):
        starts = {st.k: st.grows for st in tr.steps if st.starting}
        for k, order in enumerate(tr.orders):
            if k in starts:
                pairs.append((t, k, order))
                init.append(cut_at[t] + starts[k])
    length = max((len(o) for _, _, o in pairs), default=0)
    hi, ci = cut_h[torch.as_tensor(init)], cut_c[torch.as_tensor(init)]
    hs, cs = [hi], [ci]
    for j in range(length):
        idx = torch.as_tensor([o[j] if j < len(o) else 0 for _, _, o in pairs])
        nh, nc = agent.selector(h[idx], (hs[-1], cs[-1]))
        hs.append(nh)
        cs.append(nc)
    hh, cc = torch.stack(hs, 1), torch.stack(cs, 1)
    at = {(t, k): i * (length + 1) for i, (t, k, _) in enumerate(pairs)}
    return hh.reshape(-1, cfg.hidden), cc.reshape(-1, cfg.hidden), at


# -- §3.3: the pipeline scheduler ------------------------------------------------------------

def placement_logits(agent: Agent, h: torch.Tensor, part: np.ndarray) -> torch.Tensor:
    """(devices, partitions) log-probabilities: each accelerator's softmax over partitions
    (column-wise, Fig. 4b) of the pair scores MLP(accelerator embedding || partition summary)."""
    k = int(part.max()) + 1
    onehot = torch.zeros(k, len(part), dtype=h.dtype)
    onehot[torch.as_tensor(part), torch.arange(len(part))] = 1.0
    summaries = onehot @ h  # (k, width)
    emb = agent.accelerators.weight  # (devices, emb)
    pairs = torch.cat([emb[:, None, :].expand(-1, k, -1), summaries[None, :, :].expand(len(emb), -1, -1)], dim=-1)
    return torch.log_softmax(agent.pair_score(pairs).squeeze(-1), dim=1)


def sample_placements(logits: torch.Tensor, count: int, generator: torch.Generator | None) -> np.ndarray:
    """``count`` placements (count, devices): each device samples its partition."""
    return torch.multinomial(logits.exp(), count, replacement=True, generator=generator).T.numpy()


def masked_placement(logits: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
    """One placement in which every partition gets a device: device by device from its
    softmax restricted to ``PartitionState.placement_choices``'s rule (once the devices left
    are just enough for the partitions without one, only those)."""
    devices, k = logits.shape
    out, held = np.empty(devices, dtype=np.int64), np.zeros(k, dtype=bool)
    for d in range(devices):
        allowed = ~held if devices - d <= (~held).sum() else np.ones(k, dtype=bool)
        # renormalized from the largest allowed logit: a policy sure of a partition the rule
        # forbids gives the allowed ones probabilities whose exp() alone is 0 (0 / 0 was NaN)
        probs = torch.softmax(logits[d].masked_fill(torch.as_tensor(~allowed), -torch.inf), 0)
        out[d] = int(torch.multinomial(probs, 1, generator=generator))
        held[out[d]] = True
    return out


def placement_logp(logits: torch.Tensor, placements: np.ndarray) -> torch.Tensor:
    """Log-probability of each placement (sum over devices)."""
    idx = torch.as_tensor(placements)
    return logits[torch.arange(logits.shape[0])[None, :], idx].sum(dim=1)


def execution_logits(agent: Agent, h: torch.Tensor, placements: np.ndarray, allowed: tuple[int, ...]) -> torch.Tensor:
    """(placements, allowed) log-probabilities of the executions ``allowed`` (indices into
    ``EXECUTIONS``) for each placement: an MLP over the graph's mean node representation and
    the placement's shape (partitions, the largest partition's share of the accelerators, the
    share of partitions that are replicated). Beyond the paper, whose schedule is fixed."""
    placements = np.atleast_2d(placements)
    devices = placements.shape[1]
    k = placements.max(axis=1) + 1
    counts = np.stack([np.bincount(p, minlength=devices) for p in placements])
    shape = np.stack([k / devices, counts.max(axis=1) / devices, (counts > 1).sum(axis=1) / k], axis=1)
    x = torch.cat([h.mean(0, keepdim=True).expand(len(placements), -1), torch.as_tensor(shape, dtype=h.dtype)], 1)
    return torch.log_softmax(agent.execution_score(x)[:, list(allowed)], dim=1)


def action_logp(agent: Agent, h: torch.Tensor, inst: Instance, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Each placement's log-probability with its execution's, and the executions' entropy."""
    placed = np.stack(scheme.placements)
    logp = placement_logp(placement_logits(agent, h, scheme.part), placed)
    ex = execution_logits(agent, h, placed, inst.allowed)
    chosen = ex[torch.arange(len(placed)), torch.as_tensor(scheme.executions)]
    return logp + chosen, -(ex.exp() * ex).sum(1)


# -- sampling plans --------------------------------------------------------------------------

class Instance:
    """A (graph, cluster) pair as tensors, with the scorer of its plans."""

    def __init__(self, graph: Graph, cluster: Cluster, scorer: Scorer) -> None:
        self.graph, self.cluster, self.scorer = graph, cluster, scorer
        self.x = torch.as_tensor(node_features(graph))
        self.adj = torch.as_tensor(adjacency(graph))
        self.ancestors = Ancestors(graph)
        unknown = [e for e in scorer.executions if e not in EXECUTIONS]
        if unknown:
            raise ValueError(f"drl-pp cannot choose {unknown} (it knows {list(EXECUTIONS)})")
        self.allowed = tuple(EXECUTIONS.index(e) for e in scorer.executions)  # the scorer's, in its order

    def state(self) -> PartitionState:
        return PartitionState(self.graph, len(self.cluster), self.ancestors)


def sample_schemes(agent: Agent, inst: Instance, count: int, generator: torch.Generator) -> list[Scheme]:
    """``count`` partition schemes, each with placements sampled until
    ``placements_per_scheme`` are valid or ``resample_rounds`` rounds are spent; then every
    placement scored in one batch (an invalid one gets the scorer's infeasible reward)."""
    cfg = agent.cfg
    with torch.no_grad():
        h = agent.encoder(inst.x, inst.adj)
        cells, schemes = _Cells(agent, h), []
        for _ in range(count):
            state = inst.state()
            traj, _ = walk(agent, h, state, generator, cells)
            scheme = Scheme(traj, state.part.copy(), best=cfg.scheme_reward == "best")
            logits = placement_logits(agent, h, scheme.part)
            k = int(scheme.part.max()) + 1
            for _ in range(cfg.resample_rounds):
                drawn = sample_placements(logits, cfg.placements_per_scheme, generator)
                ex = execution_logits(agent, h, drawn, inst.allowed)
                chosen = torch.multinomial(ex.exp(), 1, generator=generator).squeeze(1)
                scheme.placements.extend(drawn)
                scheme.executions.extend(chosen.tolist())
                scheme.placement_logp.extend((placement_logp(logits, drawn) +
                                              ex[torch.arange(len(drawn)), chosen]).tolist())
                scheme.valid.extend(placement_valid(p, k) for p in drawn)
                if sum(scheme.valid) >= cfg.placements_per_scheme:
                    break
            if not any(scheme.valid):  # §3.3's resampling, to the end: one drawn under the mask
                drawn = masked_placement(logits, generator)[None]
                ex = execution_logits(agent, h, drawn, inst.allowed)
                chosen = torch.multinomial(ex.exp(), 1, generator=generator).squeeze(1)
                scheme.placements.extend(drawn)
                scheme.executions.extend(chosen.tolist())
                scheme.placement_logp.extend((placement_logp(logits, drawn) + ex[0, chosen]).tolist())
                scheme.valid.append(True)
            schemes.append(scheme)
    _score(schemes, inst.scorer)
    return schemes


def _score(schemes: list[Scheme], scorer: Scorer) -> None:
    rows = [(s, j) for s in schemes for j, ok in enumerate(s.valid) if ok]
    for s in schemes:
        s.rewards = [scorer.infeasible_reward] * len(s.placements)
        s.times = [np.inf] * len(s.placements)
    if rows:
        res = scorer.score(np.stack([s.part for s, _ in rows]), np.stack([s.placements[j] for s, j in rows]),
                           np.array([s.executions[j] for s, j in rows]))
        for (s, j), r, t in zip(rows, res.reward, res.iteration_s):
            s.rewards[j], s.times[j] = float(r), float(t)


# -- §3.4: PPO -------------------------------------------------------------------------------

def ppo_update(agent: Agent, opt: torch.optim.Optimizer, inst: Instance, schemes: list[Scheme],
               entropy_coef: float | None = None, baseline: float = 0.0) -> None:
    """Clipped PPO on the partitioner (each step of Algorithm 1, advantage: its scheme's
    reward) and on the scheduler (each placement with its execution, advantage: its reward),
    an entropy bonus (``entropy_coef``, default ``cfg.entropy_coef``) on both (``advantages``;
    ``baseline``: the moving one, for ``Config.baseline`` "moving")."""
    cfg = agent.cfg
    entropy_coef = cfg.entropy_coef if entropy_coef is None else entropy_coef
    adv_s, adv_p = advantages(schemes) if cfg.baseline == "batch" else moving_advantages(schemes, baseline)
    adv_s, adv_p = torch.as_tensor(adv_s), torch.as_tensor(adv_p)
    old_s = torch.tensor([st.logp for s in schemes for st in s.trajectory.steps], dtype=torch.float64)
    old_p = torch.tensor([lp for s in schemes for lp in s.placement_logp], dtype=torch.float64)
    for _ in range(cfg.epochs):
        h = agent.encoder(inst.x, inst.adj)
        new_s, ent, owner = replay(agent, h, [s.trajectory for s in schemes])
        new_p, ent_p = zip(*(action_logp(agent, h, inst, s) for s in schemes))
        entropy = (ent.mean() if len(ent) else 0.0) + torch.cat(ent_p).mean()
        loss = (_clipped(new_s, old_s, adv_s[owner], cfg.clip) if len(owner) else 0.0) + \
            _clipped(torch.cat(new_p), old_p, adv_p, cfg.clip) - entropy_coef * entropy
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
        opt.step()


#: the advantage of an invalid placement, or of a scheme none of whose placements is valid
#: (§3.3 penalizes them), in units of the batch's spread
INVALID_ADVANTAGE = -1.0
#: a batch whose valid rewards spread less than this (ln of time) teaches nothing: advantages 0
FLAT_SPREAD = 1e-3


def moving_advantages(schemes: list[Scheme], baseline: float) -> tuple[np.ndarray, np.ndarray]:
    """Before issue 44: every reward (the infeasible ones too) minus the moving baseline, over
    the batch's spread floored at 1e-6."""
    adv_s = np.array([s.reward for s in schemes]) - baseline
    adv_p = np.concatenate([np.array(s.rewards) for s in schemes]) - baseline
    spread = max(float(np.concatenate([adv_s, adv_p]).std()), 1e-6)
    return adv_s / spread, adv_p / spread


def advantages(schemes: list[Scheme]) -> tuple[np.ndarray, np.ndarray]:
    """(per scheme, per placement) advantages: a valid reward minus the batch's mean of its
    kind (Fig. 5's average reward as the baseline), over the spread of the valid ones; an
    invalid one ``INVALID_ADVANTAGE``; all 0 where the batch is flat (every plan the same: a
    spread floored at a tiny number turned a 0.015 difference into +15,000 and collapsed the
    policy; docs/drlpp.md)."""
    valid_s = np.array([any(s.valid) for s in schemes])
    r_s = np.array([s.reward for s in schemes])
    valid_p = np.concatenate([np.array(s.valid, dtype=bool) for s in schemes])
    r_p = np.concatenate([np.array(s.rewards) for s in schemes])
    d_s = r_s - (r_s[valid_s].mean() if valid_s.any() else 0.0)
    d_p = r_p - (r_p[valid_p].mean() if valid_p.any() else 0.0)
    spread = float(np.concatenate([d_s[valid_s], d_p[valid_p]]).std()) if valid_s.any() else 0.0
    scale = 1.0 / spread if spread >= FLAT_SPREAD else 0.0
    return (np.where(valid_s, d_s * scale, INVALID_ADVANTAGE), np.where(valid_p, d_p * scale, INVALID_ADVANTAGE))


def _clipped(new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip: float) -> torch.Tensor:
    ratio = torch.exp(new.double() - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()


# -- the training loop -----------------------------------------------------------------------

@dataclass
class Best:
    """The best plan seen: its reward, partition and placement, and where it came from."""

    reward: float = -np.inf
    part: np.ndarray | None = None
    device_part: np.ndarray | None = None
    iteration_s: float = np.inf
    execution: int = 0  # an index into the scorer's executions
    found: str = ""  # "training", "sampled", "the checkpoint's best" or a trivial plan's name
    trivial: bool = False  # ``found`` names a trivial plan

    def offer(self, schemes: list[Scheme], found: str) -> None:
        for s in schemes:
            for p, e, r, t, ok in zip(s.placements, s.executions, s.rewards, s.times, s.valid):
                if ok and r > self.reward:
                    self.reward, self.part, self.device_part, self.iteration_s, self.execution = r, s.part, p, t, e
                    self.found, self.trivial = found, False

    def offer_plans(self, scorer, parts: np.ndarray, device_parts: np.ndarray, executions: np.ndarray,
                    found: list[str], trivial: bool = False) -> None:
        """Plans given whole (the trivial ones, a checkpoint's recorded best), scored now;
        ``found``: each one's name."""
        res = scorer.score(parts, device_parts, executions)
        for p, d, e, r, t, name in zip(parts, device_parts, executions.tolist(), res.reward, res.iteration_s, found):
            if np.isfinite(t) and r > self.reward:
                self.reward, self.part, self.device_part, self.iteration_s, self.execution = float(r), p, d, float(t), e
                self.found, self.trivial = name, trivial


def offer_trivial(best: Best, inst: Instance) -> None:
    """Data parallelism and the equal-compute splits under every execution allowed
    (``learn.found``): the answer is never worse than they are."""
    parts, devs, executions = trivial_under(inst.graph, len(inst.cluster), len(inst.scorer.executions))
    names = [trivial_name(p, inst.scorer.executions[e]) for p, e in zip(parts, executions)]
    best.offer_plans(inst.scorer, parts, devs, executions, names, trivial=True)


def train(agent: Agent, inst: Instance, budget: Budget, progress: Progress | None = None,
          best: Best | None = None) -> tuple[Best, Curve]:
    """PPO until the budget is spent (at least one update): sample schemes and placements,
    score them, keep the best plan, update the baseline and the agent (§3.4)."""
    cfg = agent.cfg
    generator = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate)
    best, curve, baseline, step = best or Best(), Curve(), None, 0
    offer_trivial(best, inst)
    while step == 0 or budget.left(inst.scorer.evaluations):
        schemes = sample_schemes(agent, inst, cfg.schemes_per_update, generator)
        best.offer(schemes, "training")
        mean = float(np.mean([s.reward for s in schemes]))
        baseline = mean if baseline is None else cfg.baseline_decay * baseline + (1 - cfg.baseline_decay) * mean
        spent = budget.fraction(inst.scorer.evaluations)
        ppo_update(agent, opt, inst, schemes, cfg.entropy_coef * (cfg.entropy_final / cfg.entropy_coef) ** spent,
                   baseline)
        step += 1
        times = [t for s in schemes for t, ok in zip(s.times, s.valid) if ok and np.isfinite(t)]
        point = Point(step, budget.elapsed, inst.scorer.evaluations, mean, baseline, best.iteration_s,
                      float(np.median(times)) if times else float("nan"))
        curve.add(point)
        if progress is not None:
            progress(point, budget.fraction(inst.scorer.evaluations))
    return best, curve


def sample_best(agent: Agent, inst: Instance, schemes: int, best: Best | None = None) -> Best:
    """Plan with a trained agent: sample ``schemes`` schemes (and their placements), keep the
    best scored plan."""
    generator = torch.Generator().manual_seed(agent.cfg.seed)
    best = best or Best()
    best.offer(sample_schemes(agent, inst, schemes, generator), "sampled")
    return best


def new_agent(cfg: Config, devices: int) -> Agent:
    seed_everything(cfg.seed)
    return Agent(cfg, devices)

