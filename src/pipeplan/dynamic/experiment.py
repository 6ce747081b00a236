"""One DynPartition experiment from end to end: the network, the devices (real, measured by
the executor, or simulated on the cost model), training and held-out trees, the learned
policy and every baseline of §8.2 plus the algorithmic yardsticks, scored the same way
(``SchedulerEnv.forward_ms``). What ``pipeplan dynamic bench|train|eval`` and the benchmarks run."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import PipeplanError
from ..learn.harness import Budget, Progress
from . import agent as dqn
from .simulator import Machine
from .env import MAX_NODES, SchedulerEnv
from .executor import MODES, Executor, parse_devices
from .machines import executor_overhead, measured, simulated
from .nets import build_net
from .placers import heft, optimal, random_placement
from .trees import Tree, binary_parse_tree, sample_trees

#: held-out trees are drawn with this offset on the seed: never the training trees
TEST_SEED = 1_000_003
#: the exact optimum is computed on every held-out tree whose branch and bound finishes within
#: this much work (``placers.optimal``'s ``max_work``)
OPTIMAL_WORK = 300_000
#: small held-out trees the exact optimum is tried on
SMALL_TREES = 12


@dataclass
class Setup:
    """What an experiment runs on. Exactly one of ``devices`` (real device names) and
    ``simulated`` (a machine spec such as ``cpu+4gpu``, whose CPU is ``machine_model``'s:
    ``machines.machine_model``)."""

    net: str = "treelstm"
    width: int | None = None
    devices: list[str] | None = None
    simulated: str | None = None
    mode: str = "devices"
    repeats: int = 10
    normalized: bool = False
    seed: int = 0
    train_trees: int = 1000
    test_trees: int = 50
    machine_model: dict | None = None

    def check(self) -> None:
        if (self.devices is None) == (self.simulated is None):
            raise PipeplanError("give the devices to run on (--devices cpu,cuda:0,...) or a machine to simulate "
                                "(--simulated cpu+4gpu), not both")
        if self.devices is not None and self.machine_model is not None:
            raise PipeplanError("a machine model (--machine) goes with a simulated machine; real devices are measured")
        if self.mode not in MODES:
            raise PipeplanError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        for name, v in (("--repeats", self.repeats), ("--train-trees", self.train_trees),
                        ("--test-trees", self.test_trees)):
            if v < 1:
                raise PipeplanError(f"{name} must be >= 1, got {v}")
        build_net(self.net, self.width)  # names the network or width that is wrong


@dataclass
class Bench:
    """A built setup: the reward environment (its trees are the training trees), the cost
    model of the devices (for HEFT and the optimum), the held-out trees."""

    setup: Setup
    env: SchedulerEnv
    machine: Machine
    test: list[Tree]
    build_s: float

    @property
    def names(self) -> list[str]:
        return self.machine.names

    def profile(self, tree: Tree):
        return self.env.profile(tree)

    def mean_ms(self, placements: list[list[int]], trees: list[Tree] | None = None) -> float:
        trees = self.test if trees is None else trees
        return float(np.mean([self.env.forward_ms(t, p) for t, p in zip(trees, placements)]))


def build(setup: Setup) -> Bench:
    """Calibrate (real: every device and link; simulated: the machine model's CPU) and draw
    the trees."""
    setup.check()
    t0 = time.perf_counter()
    width = build_net(setup.net, setup.width).width
    if setup.devices is not None:
        names = parse_devices(",".join(setup.devices))
        ex = Executor(build_net(setup.net, width, setup.seed), names, setup.mode)
        m = measured(names)
        m.part_overhead_s = executor_overhead(ex, setup.net, width, sample_trees(setup.net, 5, setup.seed + 17), m)
        env = SchedulerEnv(setup.net, width, setup.seed, len(names), measure=ex, normalized=setup.normalized,
                           repeats=setup.repeats, tree_count=setup.train_trees)
    else:
        if setup.machine_model is None:
            raise PipeplanError(f"simulated {setup.simulated}: no machine model (machines.machine_model) for its CPU")
        m = simulated(setup.simulated, setup.machine_model)
        env = SchedulerEnv(setup.net, width, setup.seed, len(m.devices), simulate=m, normalized=setup.normalized,
                           tree_count=setup.train_trees)
    test = sample_trees(setup.net, setup.test_trees, setup.seed + TEST_SEED, max_nodes=MAX_NODES)
    return Bench(setup, env, m, test, time.perf_counter() - t0)


def baselines(bench: Bench, seed: int = 0) -> dict:
    """Mean ms on the held-out trees of: all on the CPU (device 0), all on each other device,
    ``gpu`` (all on the first CUDA device, None without one), random (§8.2.1-8.2.3), HEFT
    (cost-model list scheduling); ``optimal_subset``: the cost model's exact optimum on small
    held-out trees (``_optimal``)."""
    trees, names = bench.test, bench.names
    out: dict = {"cpu": bench.mean_ms([[0] * t.n for t in trees])}
    for d, name in enumerate(names[1:], 1):
        out[f"all on {name}"] = bench.mean_ms([[d] * t.n for t in trees])
    gpus = [n for n in names if n.startswith("cuda")]
    out["gpu"] = out[f"all on {gpus[0]}"] if gpus else None
    rng = np.random.default_rng(seed)
    out["random"] = bench.mean_ms([random_placement(t.n, len(names), rng) for t in trees])
    out["heft"] = bench.mean_ms([heft(bench.profile(t), bench.machine) for t in trees])
    out["optimal_subset"] = _optimal(bench)
    return out


def small_trees(net: str, count: int, seed: int) -> list[Tree]:
    """Held-out inputs small enough for the exact optimum: TreeLSTM sentences of 3 to 7 words
    (5 to 13 nodes; SST's are 18 on average), MathFunc expressions as usual (11 to 21 nodes)."""
    if net != "treelstm":
        return sample_trees(net, count, seed + TEST_SEED + 1)
    rng = np.random.default_rng(seed + TEST_SEED + 1)
    return [binary_parse_tree(int(rng.integers(3, 8)), rng) for _ in range(count)]


def _optimal(bench: Bench) -> dict | None:
    """The exact optimum (``placers.optimal``) on small held-out trees, with HEFT and the CPU
    on the same trees; trees the search cannot finish within ``OPTIMAL_WORK`` are left out."""
    places, trees = [], []
    for t in small_trees(bench.env.net, SMALL_TREES, bench.setup.seed):
        try:
            places.append(optimal(bench.profile(t), bench.machine, OPTIMAL_WORK)[0])
            trees.append(t)
        except PipeplanError:  # too big for the exact search
            continue
    if not trees:
        return None
    return {"trees": trees, "nodes": [t.n for t in trees], "optimal_ms": bench.mean_ms(places, trees),
            "heft_ms": bench.mean_ms([heft(bench.profile(t), bench.machine) for t in trees], trees),
            "cpu_ms": bench.mean_ms([[0] * t.n for t in trees], trees)}


def train(bench: Bench, config: dqn.Config, budget: Budget, progress: Progress | None = None) -> dqn.Result:
    """The DQN on the bench's environment, its greedy policy checked on held-out trees."""
    held = bench.test[:config.eval_trees]

    def eval_fn(agent: dqn.Agent) -> tuple[float, float]:
        return dqn.evaluate(agent, bench.env, held)

    return dqn.train(bench.env, config, budget, progress, eval_fn if config.eval_every > 0 else None)


def report(bench: Bench, agent: dqn.Agent, base: dict, result: dqn.Result | None = None) -> dict:
    """The JSON the CLI prints: the policy's mean ms, the baselines (``optimal``: the exact
    optimum's mean ms on the small trees, beside the policy's, HEFT's and the CPU's on them),
    the setup."""
    out = {"policy_ms": bench.mean_ms(agent.policy(bench.test)), "baselines": strip(base),
           "optimal_subset": None, **describe(bench)}
    sub = base.get("optimal_subset")
    if sub:
        out["optimal_subset"] = {**strip(sub), "policy_ms": bench.mean_ms(agent.policy(sub["trees"]), sub["trees"])}
    if result is not None:
        out.update({"episodes": result.episodes, "train_s": result.elapsed_s,
                    "final_reward_mean": float(np.mean(result.rewards[-100:])) if len(result.rewards) else None})
    return out


def strip(d: dict) -> dict:
    """``d`` without trees (for JSON): the optimum's subset becomes its summary numbers."""
    out = {k: v for k, v in d.items() if k not in ("trees", "optimal_subset")}
    if "optimal_subset" in d:
        out["optimal"] = d["optimal_subset"]["optimal_ms"] if d["optimal_subset"] else None
    return out


def describe(bench: Bench) -> dict:
    return {"net": bench.env.net, "width": bench.env.width, "devices": bench.names,
            "reward": "measured" if bench.setup.devices else "simulated", "normalized": bench.setup.normalized,
            "test_trees": len(bench.test), "machine": bench.machine.note}
