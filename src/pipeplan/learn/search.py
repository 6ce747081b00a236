"""Search baselines for the learning planners: random search and simulated annealing.

The evaluation standard (drl-pp.txt) demands that a learning planner be compared with two
search baselines "given the same number of evaluator calls and the same wall-clock: random
search and simulated annealing over the same action space". Both searches here therefore

* walk the action space of ``partition.PartitionState`` (DRL-PP's Algorithm 1, then the
  placement), so they can reach exactly the plans the agents can reach;
* score candidates with the same ``Scorer`` (the same reward, -ln(iteration time) with the
  same penalties) and count evaluations on it;
* stop on the same ``harness.Budget`` (evaluations and/or seconds; the evaluations of the
  last batch are trimmed so an evaluation budget is never exceeded when the scorer starts at 0).

Where the scorer offers several executions (schedule, replica mode), a walk's last action
picks one, uniformly in random search, so the searches reach what DRL-PP's execution head
can; it is encoded as ``-1 - e`` for the scorer's execution ``e``.

Random search samples complete plans by choosing uniformly among each step's valid actions.
That is **uniform over actions, not over plans**: a plan reachable by few action sequences,
or through steps with many alternatives, is rarer than one reached through forced steps (on
a chain, for example, the first partitions tend to be short and the last one long).

Simulated annealing keeps a current plan, encoded by its action sequence. A move re-samples
a suffix: pick a step among those that had more than one valid action, keep the actions
before it, and complete the plan from there uniformly at random, as random search does. Each
iteration proposes ``neighbours`` such moves from the current plan, scores them in one batch
(the scorer is much faster per candidate in batches), then runs the Metropolis test on them
in order: a neighbour is accepted with probability ``min(1, exp((r - r_current) / T))`` and
the accepted one becomes the current plan for the tests that follow (they stay neighbours of
the plan the iteration started from). The temperature cools geometrically, ``T = T0 *
(T1 / T0) ** f``, where ``f`` is the fraction of the budget spent; the defaults T0 = 1.0 and
T1 = 0.01 are in reward units (ln of time): at the start a plan e times slower is accepted
with probability 1/e, at the end one 1 % slower is. The start is the best of a first batch of
random plans. ``neighbours`` = 16 by default: the scorer costs a few ms per call whatever the
batch, so 64 per batch scores about three times as many plans per second, but on resnet50
(4 GPUs) 16 did better both at equal evaluations and at equal wall-clock.

Speed: the walks are the hot path (a ``PartitionState`` step recomputes its mask with numpy,
about 60 us, ten times the scorer's cost per candidate). ``_Walk`` replays the same state
machine on Python integer bit sets; the tests check that it offers exactly the valid actions
``PartitionState.mask`` does and ends in the same plan for the same actions.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph
from .harness import Budget
from .partition import Ancestors
from .scoring import Scorer

DEFAULT_T0 = 1.0
DEFAULT_T1 = 0.01


@dataclass
class SearchResult:
    """The best plan a search saw and what the search spent.

    ``reward``: its reward; ``part`` (nodes) / ``device_part`` (devices): the plan, as the
    scorer takes it; ``iteration_s``: its iteration time (inf if it cannot run); ``fits``:
    whether it fits in memory; ``evaluations``: candidates this search scored; ``seconds``:
    ``budget.elapsed`` at the end; ``curve``: after every scored batch, (the scorer's
    evaluation count, ``budget.elapsed``, best iteration time so far)."""

    reward: float = -math.inf
    part: np.ndarray | None = None
    device_part: np.ndarray | None = None
    execution: int = 0  # an index into the scorer's executions
    iteration_s: float = math.inf
    fits: bool = False
    evaluations: int = 0
    seconds: float = 0.0
    curve: list[tuple[int, float, float]] = field(default_factory=list)


# -- a fast walk over PartitionState's action space --------------------------------------------

class _Space:
    """A graph's constants for ``_Walk``: node sets as Python int bit sets (bit u: node u)."""

    def __init__(self, graph: Graph, devices: int, ancestors: Ancestors | None = None, executions: int = 1) -> None:
        matrix = (ancestors or Ancestors(graph)).matrix
        self.n, self.devices, self.executions = len(graph), devices, executions
        self.closure = [_bits(matrix[v]) | (1 << v) for v in range(self.n)]  # v and its ancestors
        self.succ = [0] * self.n
        for u, v in graph.edges:
            self.succ[u] |= 1 << v
        self.sources = sum(1 << v for v in range(self.n) if not graph.pred[v])
        self.every = (1 << self.n) - 1


def _bits(row: np.ndarray) -> int:
    return int.from_bytes(np.packbits(row.astype(bool), bitorder="little").tobytes(), "little")


def _nth_bit(bits: int, j: int) -> int:
    """The index of the j-th (from 0) set bit of ``bits``, lowest first."""
    for _ in range(j):
        bits &= bits - 1
    return (bits & -bits).bit_length() - 1


class _Walk:
    """One episode of ``PartitionState`` (same flat actions, same rules), without the masks'
    numpy cost. ``actions``: the actions taken; ``choices``: how many were valid at each."""

    __slots__ = ("s", "free", "fed", "part", "k", "starting", "partitioning", "device_part",
                 "held", "unheld", "execution", "actions", "choices")

    def __init__(self, space: _Space) -> None:
        self.s = space
        self.free, self.fed = space.every, 0  # unassigned nodes; nodes with an assigned predecessor
        self.part = [-1] * space.n
        self.k, self.starting, self.partitioning = 0, True, True
        self.device_part: list[int] = []
        self.held: list[int] = []  # devices per partition (placement phase)
        self.unheld = 0
        self.execution = 0 if space.executions == 1 else -1  # chosen last, when there is a choice
        self.actions: list[int] = []
        self.choices: list[int] = []
        if space.devices == 1:
            self._rest()

    @property
    def placed(self) -> bool:
        return not self.partitioning and len(self.device_part) == self.s.devices

    @property
    def done(self) -> bool:
        return self.placed and self.execution >= 0

    def _assign(self, nodes: int) -> None:
        self.free &= ~nodes
        part, succ, k = self.part, self.s.succ, self.k
        while nodes:
            low = nodes & -nodes
            u = low.bit_length() - 1
            part[u] = k
            self.fed |= succ[u]
            nodes ^= low

    def _rest(self) -> None:
        self._assign(self.free)
        self.partitioning = False
        self.k = max(self.part) + 1
        self.held, self.unheld = [0] * self.k, self.k

    def _close(self) -> None:
        self.k += 1
        if not self.free:
            self.partitioning = False
            self.held, self.unheld = [0] * self.k, self.k
        elif self.k == self.s.devices - 1:
            self._rest()
        else:
            self.starting = True

    def _placement_all(self) -> bool:
        """Whether the next device may take any partition (else only those with none)."""
        return self.s.devices - len(self.device_part) > self.unheld

    def valid(self) -> list[int]:
        """The valid flat actions, ascending (as ``np.flatnonzero(PartitionState.mask())``)."""
        n = self.s.n
        if self.partitioning:
            cand, out = self.free & (self.s.sources | self.fed), []
            while cand:
                low = cand & -cand
                out.append(low.bit_length() - 1)
                cand ^= low
            return out if self.starting else out + [n]
        if self.done:
            return []
        if self.placed:
            return [-1 - e for e in reversed(range(self.s.executions))]
        every = self._placement_all()
        return [n + 1 + p for p in range(self.k) if every or not self.held[p]]

    def apply(self, action: int) -> None:
        """Take a valid action (not checked: replays and random draws only make valid ones)."""
        n = self.s.n
        self.actions.append(action)
        if action < 0:
            self.execution = -1 - action
        elif not self.partitioning:
            p = action - n - 1
            self.device_part.append(p)
            self.unheld -= not self.held[p]
            self.held[p] += 1
        elif action == n:
            self._close()
        else:
            self._assign(self.s.closure[action] & self.free)
            self.starting = False
            if not self.free:
                self._close()

    def random_step(self, u: float) -> None:
        """Take the valid action at ``floor(u * count)`` of the ascending valid actions."""
        n = self.s.n
        if self.partitioning:
            cand = self.free & (self.s.sources | self.fed)
            count = cand.bit_count() + (not self.starting)
            j = int(u * count)
            action = n if j == cand.bit_count() else _nth_bit(cand, j)
        elif self.placed:
            count = self.s.executions
            action = -1 - int(u * count)
        else:
            ok = range(self.k) if self._placement_all() else [p for p in range(self.k) if not self.held[p]]
            count = len(ok)
            action = n + 1 + ok[int(u * count)]
        self.choices.append(count)
        self.apply(action)


def _complete(walk: _Walk, py: random.Random) -> _Walk:
    """Finish ``walk`` uniformly at random over each step's valid actions."""
    while not walk.done:
        walk.random_step(py.random())
    return walk


def _replay(space: _Space, actions: list[int], choices: list[int]) -> _Walk:
    walk = _Walk(space)
    for a in actions:
        walk.apply(a)
    walk.choices = list(choices)
    return walk


# -- the searches ------------------------------------------------------------------------------

class _Tracker:
    """The best plan so far and the curve, for one search."""

    def __init__(self, scorer: Scorer, budget: Budget) -> None:
        self.scorer, self.budget, self.start = scorer, budget, scorer.evaluations
        self.result = SearchResult()

    def size(self, batch: int) -> int:
        """The next batch's size: ``batch``, trimmed to the evaluations the budget has left."""
        if self.budget.evaluations is None:
            return batch
        return max(1, min(batch, self.budget.evaluations - self.scorer.evaluations))

    def score(self, walks: list[_Walk]) -> np.ndarray:
        """Score the walks' plans in one call; update the best and the curve; the rewards."""
        part = np.array([w.part for w in walks], dtype=np.int64)
        device_part = np.array([w.device_part for w in walks], dtype=np.int64)
        execution = np.array([w.execution for w in walks], dtype=np.int64)
        res = self.scorer.score(part, device_part, execution)
        i = int(np.argmax(res.reward))
        r = self.result
        if res.reward[i] > r.reward:
            r.reward, r.part, r.device_part = float(res.reward[i]), part[i].copy(), device_part[i].copy()
            r.execution = int(execution[i])
            r.iteration_s, r.fits = float(res.iteration_s[i]), bool(res.fits[i])
        r.evaluations = self.scorer.evaluations - self.start
        r.seconds = self.budget.elapsed
        r.curve.append((self.scorer.evaluations, r.seconds, r.iteration_s))
        return res.reward


def random_search(scorer: Scorer, graph: Graph, devices: int, budget: Budget, rng: np.random.Generator,
                  batch: int = 64, ancestors: Ancestors | None = None) -> SearchResult:
    """Score batches of ``batch`` plans sampled uniformly over each step's valid actions (not
    uniformly over plans; module docstring) until ``budget`` is spent; the best plan by
    reward. At least one batch is scored; a batch is cut to the evaluations the budget has
    left (at least one)."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    space = _Space(graph, devices, ancestors, len(scorer.executions))
    py = random.Random(int(rng.integers(2**63)))
    track = _Tracker(scorer, budget)
    while True:
        track.score([_complete(_Walk(space), py) for _ in range(track.size(batch))])
        if not budget.left(scorer.evaluations):
            return track.result


def _neighbour(space: _Space, current: _Walk, py: random.Random) -> _Walk:
    """Re-sample a suffix of ``current``: keep the actions before a random step that had more
    than one valid action (any step if none had) and complete the rest at random."""
    steps = [i for i, c in enumerate(current.choices) if c > 1] or list(range(len(current.choices)))
    i = py.choice(steps) if steps else 0
    return _complete(_replay(space, current.actions[:i], current.choices[:i]), py)


def simulated_annealing(scorer: Scorer, graph: Graph, devices: int, budget: Budget, rng: np.random.Generator,
                        neighbours: int = 16, t0: float = DEFAULT_T0, t1: float = DEFAULT_T1,
                        ancestors: Ancestors | None = None) -> SearchResult:
    """Simulated annealing over the same action space (module docstring): start from the best
    of ``neighbours`` random plans; each iteration scores ``neighbours`` suffix re-samplings of
    the current plan in one batch and runs the Metropolis test on them in order at the
    temperature ``t0 * (t1 / t0) ** budget.fraction``; stops when ``budget`` is spent (at
    least one batch). The best plan seen by reward."""
    if neighbours < 1:
        raise ValueError(f"neighbours must be at least 1, got {neighbours}")
    if not (t0 > 0 and t1 > 0):
        raise ValueError(f"temperatures must be positive, got t0={t0}, t1={t1}")
    space = _Space(graph, devices, ancestors, len(scorer.executions))
    py = random.Random(int(rng.integers(2**63)))
    track = _Tracker(scorer, budget)
    walks = [_complete(_Walk(space), py) for _ in range(track.size(neighbours))]
    rewards = track.score(walks)
    i = int(np.argmax(rewards))
    current, reward = walks[i], float(rewards[i])
    while budget.left(scorer.evaluations):
        temperature = t0 * (t1 / t0) ** budget.fraction(scorer.evaluations)
        walks = [_neighbour(space, current, py) for _ in range(track.size(neighbours))]
        for walk, r in zip(walks, track.score(walks).tolist()):
            if r >= reward or py.random() < math.exp((r - reward) / temperature):
                current, reward = walk, r
    return track.result
