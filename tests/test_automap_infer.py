"""Auto-MAP's online inference (planners/automap/arrays, coarse_optimum, infer, bounds): the
data processing on a worked example, the abstract value against the real simulator, the
lower bound against the simulator, the exact optimum against brute force, the environment's
masks, and the shipped checkpoint planning models it never saw."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from pipeplan.cluster import hierarchical, load_cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.automap.arrays import POINTS, Instance, coarsen, from_graph, real_plan, topology
from pipeplan.planners.automap.coarse_optimum import lower_bounds, optimum
from pipeplan.planners.automap.enumerate import plans
from pipeplan.planners.automap.infer import SHIPPED, InferEnv, beam, load_agent
from pipeplan.planners.automap.training_data import generated
from pipeplan.planners.automap.problem import CutProblem
from pipeplan.sim import simulate

from conftest import profile_path


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny networks: one intra-op thread (extra threads only contend on a shared machine). That
    planning loads no torch is checked in a process of its own."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_coarsen_worked_example() -> None:
    # 4 instructions, 3 points: positions round(i * 4 / 2) = 0, 2, 4
    c, a, w, pos, top = coarsen(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 5.0, 12.0, 6.0, 0.0]),
                                np.array([0.0, 4.0, 0.0, 2.0]), points=3)
    assert pos.tolist() == [0, 2, 4]
    # prefix sums C' = 0, 1, 3, 6, 10 and W' = 0, 0, 4, 4, 6 at the points; A as it is
    assert top == 12.0                        # max(C'' = 0, 3, 10; A'' = 0, 12, 0; W'' = 0, 4, 6)
    assert c.tolist() == pytest.approx([0, 3 / 12, 10 / 12])
    assert a.tolist() == pytest.approx([0, 1, 0])
    assert w.tolist() == pytest.approx([0, 4 / 12, 6 / 12])


def test_coarse_value_is_the_real_simulation_scaled() -> None:
    """On a chain, boundaries at points cut the real model at their positions: the coarse
    value times the common maximum is the real iteration time (memory and latency aside)."""
    g = load_graph("zoo:bert-large?layers=8")
    c = hierarchical("2x4", 2, 4, 400e9, 3e9, kind="V100")
    inst = from_graph(g, c, 8, 2)
    bounds, dcuts = [60], [4]
    real = simulate(real_plan(g, c, inst, bounds, dcuts, 8)).iteration_s
    assert inst.values(np.array([bounds]), np.array([dcuts]))[0] * inst.scale == pytest.approx(real, rel=1e-9)
    assert topology(c)[0, 5] == pytest.approx(3e9 / 400e9)


@pytest.mark.parametrize("seed", range(3))
def test_lower_bound_never_exceeds_the_simulation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    inst = generated(rng)
    pts = np.arange(1, POINTS - 1)
    for _ in range(40):
        b = np.sort(rng.choice(pts, inst.stages - 1, replace=False))
        d = np.sort(rng.choice(np.arange(1, inst.devices), inst.stages - 1, replace=False))
        lb = lower_bounds(inst, b[None, :], d)[0]
        assert lb <= inst.values(b[None, :], d[None, :])[0] * (1 + 1e-9)


def test_lower_bound_of_the_pruned_problem_never_exceeds_the_simulation() -> None:
    g = load_graph("zoo:t5-base?granularity=op&layers=4")
    c = load_cluster("automap-b")
    p = CutProblem(g, c, 3, 8)
    rows = np.concatenate(list(plans(p)))
    rows = rows[np.random.default_rng(0).choice(len(rows), min(500, len(rows)), replace=False)]
    it, _ = p.values(rows)
    assert np.all(p.lower_bounds(rows) <= it * (1 + 1e-9))


def small_instance(stages: int = 3) -> Instance:
    rng = np.random.default_rng(7)
    compute, act, params = rng.random(12), np.concatenate(([0], rng.random(11), [0])), rng.random(12)
    cc, aa, ww, pos, top = coarsen(compute, act * 0.2, params * 0.3, points=13)
    topo = np.where(np.repeat(np.arange(2), 2)[:, None] == np.repeat(np.arange(2), 2)[None, :], 1.0, 0.1)
    return Instance(cc, aa, ww, topo, 4, stages, pos, top)


def test_coarse_optimum_equals_brute_force() -> None:
    inst = small_instance()
    best = np.inf
    for b in itertools.combinations(range(1, 12), 2):
        for d in itertools.combinations(range(1, 4), 2):
            best = min(best, float(inst.values(np.array([b]), np.array([d]))[0]))
    assert optimum(inst).value == pytest.approx(best, rel=1e-12)


def test_shaping_bound_is_optimistic_and_shaped_returns_telescope() -> None:
    """On random plays of generated instances: the bound of every partial plan is at least
    the final ideal/L, and the discounted shaped return is the discounted final reward minus
    Φ(start) = gamma^(T-1) (the bound of the empty plan is 1)."""
    rng, gamma = np.random.default_rng(1), 0.6
    for _ in range(30):
        env = InferEnv(gamma=gamma)
        env.use(generated(rng))
        for _ in range(3):
            obs, info = env.reset()
            bounds, done, ret, disc = [], False, 0.0, 1.0
            while not done:
                bounds.append(env.bound())
                obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
                ret, disc = ret + disc * r, disc * gamma
            assert min(bounds) >= info["ratio"] * (1 - 1e-9) and bounds[0] == pytest.approx(1.0)
            assert ret == pytest.approx(disc / gamma * (info["ratio"] - 1.0), abs=1e-12)


def test_env_alternates_boundaries_and_device_cuts_under_masks() -> None:
    env = InferEnv()
    inst = generated(np.random.default_rng(3))
    env.use(inst)
    obs, info = env.reset()
    assert obs.shape == (InferEnv.OBS,) and obs.min() >= 0 and obs.max() <= 1
    k = inst.stages
    assert info["action_mask"][0] == 0 and info["action_mask"][1] and not info["action_mask"][POINTS - 1]
    obs, _, done, _, info = env.step(40)
    assert not done and info["action_mask"].sum() == inst.units - 1 - (k - 2)
    assert not info["action_mask"][inst.devices - (k - 1) + 1:].any()
    obs, _, done, _, info = env.step(1)
    if k > 2:
        assert not info["action_mask"][:41].any()


def test_env_masks_points_sharing_a_real_position() -> None:
    """A model of 6 nodes has 7 cut positions for 128 points: boundaries must land on
    distinct positions strictly inside the model, leaving room for the later ones."""
    g = Graph.chain("six", fwd=[1.0] * 6, bwd=[2.0] * 6, params=[1.0] * 6, act=[1.0] * 6)
    inst = from_graph(g, hierarchical("1x4", 1, 4, 1e9, 1e9, speed=1.0), 4, 3)
    env = InferEnv()
    env.use(inst)
    _, info = env.reset()
    allowed = set(inst.positions[info["action_mask"]].tolist())
    assert allowed == {1, 2, 3, 4}                     # position 5 would leave no room for the second cut
    first = int(np.flatnonzero(inst.positions == 4)[0])
    _, _, _, _, info = env.step(first)
    _, _, _, _, info = env.step(1)
    assert set(inst.positions[info["action_mask"]].tolist()) == {5}


def test_beam_of_one_is_the_greedy_policy_and_a_wide_beam_finds_the_optimum() -> None:
    """Width 1: at every step the valid action of largest Q (the paper's greedy plan,
    replayed here step by step). A beam wider than the number of distinct partial plans
    keeps them all, so it returns the exact optimum of the instance."""
    import torch

    from pipeplan.learn.dqn import q_network
    from pipeplan.learn.harness import load_checkpoint
    from pipeplan.planners.automap.infer import AGENT, POINTS, config

    agent = load_agent()  # planning's network, in numpy; the replay below runs torch's on the same weights
    online = q_network(InferEnv.OBS, POINTS, config())
    online.load_state_dict({k: v.float() for k, v in load_checkpoint(str(SHIPPED), AGENT)["state"].items()})
    g = Graph.chain("six", fwd=[1.0, 3.0, 2.0, 1.0, 4.0, 1.0], bwd=[2.0, 6.0, 4.0, 2.0, 8.0, 2.0],
                    params=[1.0] * 6, act=[3.0, 1.0, 2.0, 5.0, 1.0, 1.0])
    inst = from_graph(g, hierarchical("2x2", 2, 2, 1e9, 1e8, speed=1.0), 4, 3)
    env = InferEnv()
    env.use(inst)
    obs, info = env.reset()
    done = False
    while not done:
        with torch.no_grad():
            q = online(torch.as_tensor(obs)[None])[0].numpy()
        obs, _, done, _, info = env.step(int(np.argmax(np.where(info["action_mask"], q, -np.inf))))
    found = beam(agent, InferEnv(), inst, 1)
    assert (found.bounds, found.dcuts) == (info["bounds"], info["dcuts"])
    assert beam(agent, InferEnv(), inst, 1000).value == pytest.approx(optimum(inst).value, rel=1e-12)


def test_shipped_checkpoint_plans_models_it_never_saw(tmp_path) -> None:
    assert SHIPPED.is_file(), "the shipped automap-infer checkpoint is missing (docs/automap.md rebuilds it)"
    assert SHIPPED.stat().st_size < 4 * 2**20
    for spec, cluster in (("zoo:t5-11b?layers=4", "automap-c"), ("zoo:bert-48?granularity=op", "automap-b")):
        g, c = load_graph(spec), load_cluster(cluster)
        plan, result = run_planner("automap-infer", g, c, PlanOptions(microbatches=16))
        info = plan.extra["automap-infer"]
        assert len(plan.stages) == (4 if cluster == "automap-c" else 3)
        assert len(info["cuts"]) == len(info["layers"]) == len(info["device_cuts"]) == len(plan.stages) - 1
        assert np.isfinite(result.iteration_s)


def test_shipped_checkpoint_plans_a_pipedream_profile() -> None:
    g, c = load_graph(str(profile_path("vgg16"))), load_cluster("automap-a")
    plan, result = run_planner("automap-infer", g, c, PlanOptions(microbatches=16))
    assert len(plan.stages) == 2 and np.isfinite(result.iteration_s)


def test_cli_train_and_plan_bad_inputs(tmp_path, capsys) -> None:
    from pipeplan.cli import main

    assert main(["train", "automap-infer", "--model", "zoo:bert-48", "--evaluations", "5"]) == 2
    assert main(["train", "drl-pp", "--data", "cnn", "--model", "zoo:bert-48", "--cluster", "automap-a"]) == 2
    assert main(["plan", "--model", "zoo:bert-48", "--cluster", "automap-a", "--planner", "automap-infer",
                 "-O", f"checkpoint={tmp_path / 'none.pt'}"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err
    assert main(["plan", "--model", "zoo:bert-48", "--cluster", "automap-a", "--planner", "automap-infer",
                 "-O", "beam=0"]) == 2
    err = capsys.readouterr().err
    assert "beam" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_trains_automap_infer_briefly(tmp_path, capsys) -> None:
    from pipeplan.cli import main

    out = tmp_path / "ai.pt"
    assert main(["train", "automap-infer", "--evaluations", "60", "--seed", "1", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 60 and summary["greedy_reward"] > 0 and out.is_file() and (tmp_path / "ai.csv").is_file()
    assert main(["plan", "--model", "zoo:t5-base", "--cluster", "automap-a", "--planner", "automap-infer",
                 "-O", f"checkpoint={out}", "--json"]) == 0


def test_plan_reports_set_up_apart_and_loads_the_agent_once(tmp_path, capsys) -> None:
    """A checkpoint is loaded once a process (per version of the file): the first plan says
    what its set-up took apart from its planning, a second one has none and plans in
    milliseconds, as README says; a rewritten checkpoint is loaded again."""
    import re
    import shutil

    from pipeplan.cli import main

    ck = tmp_path / "agent.pt"
    shutil.copyfile(SHIPPED, ck)
    argv = ["plan", "--model", "zoo:bert-48", "--cluster", "automap-a", "--planner", "automap-infer",
            "-O", f"checkpoint={ck}"]
    before = load_agent(ck)
    assert load_agent(ck) is before
    shutil.copyfile(SHIPPED, tmp_path / "other.pt")
    (tmp_path / "other.pt").replace(ck)  # a new version of the file: loaded again
    os.utime(ck, ns=(ck.stat().st_atime_ns, ck.stat().st_mtime_ns + 10**9))
    assert main(argv) == 0
    first = " ".join(capsys.readouterr().out.split())
    assert re.search(r"\(planned in [\d.]+ m?s; set-up [\d.]+ m?s: the agent, loaded once a process\)", first)
    assert main(argv) == 0
    second = " ".join(capsys.readouterr().out.split())
    assert re.search(r"\(planned in [\d.]+ ms\)", second) and "set-up" not in second
    assert load_agent(ck) is not before
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "plans any model zero-shot in under a second" in readme and "(`planned in ...; set-up ...`)" in readme


def test_planning_runs_torchs_network_in_numpy_from_the_shipped_twin() -> None:
    """The shipped ``.npz`` is the ``.pt``'s weights (as stored), made from its very bytes, and
    the numpy forward gives torch's ``PointwiseQ`` Q-values on random observations."""
    import hashlib

    import torch

    from pipeplan.learn.dqn import q_network
    from pipeplan.learn.harness import load_checkpoint
    from pipeplan.planners.automap.infer import AGENT, POINTS, config
    from pipeplan.planners.automap.policy import SOURCE, twin

    data = load_checkpoint(str(SHIPPED), AGENT)
    with np.load(twin(SHIPPED)) as npz:
        assert str(npz[SOURCE]) == hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
        for k, v in data["state"].items():
            assert np.array_equal(npz[k], v.numpy())
    online = q_network(InferEnv.OBS, POINTS, config())
    online.load_state_dict({k: v.float() for k, v in data["state"].items()})
    obs = np.random.default_rng(0).random((8, InferEnv.OBS), dtype=np.float32)
    with torch.no_grad():
        theirs = online(torch.as_tensor(obs)).numpy()
    assert np.allclose(load_agent().q(obs), theirs, rtol=1e-5, atol=1e-5)


def test_a_replaced_checkpoint_is_not_planned_with_its_stale_twin(tmp_path) -> None:
    """A twin made from other bytes is ignored: the checkpoint's own weights are loaded."""
    import shutil

    import torch

    from pipeplan.learn.harness import checkpoint, load_checkpoint, save_bytes
    from pipeplan.planners.automap.infer import AGENT, config
    from pipeplan.planners.automap.policy import twin

    data = load_checkpoint(str(SHIPPED), AGENT)
    zeroed = {k: torch.zeros_like(v) for k, v in data["state"].items()}
    ck = tmp_path / "agent.pt"
    ck.write_bytes(save_bytes(checkpoint(AGENT, config(), zeroed, {})))
    shutil.copyfile(twin(SHIPPED), twin(ck))  # the shipped weights' twin beside other weights
    obs = np.random.default_rng(1).random((2, InferEnv.OBS), dtype=np.float32)
    assert np.allclose(load_agent(ck).q(obs), 0.0) and not np.allclose(load_agent().q(obs), 0.0)


def test_a_plan_with_the_shipped_agent_loads_neither_torch_nor_numba_nor_gymnasium() -> None:
    """What makes its cold start short (benchmarks/automap/infer_latency.py measures it)."""
    import subprocess
    import sys

    code = ("import sys; from pipeplan.cli import main\n"
            "assert main(['plan', '--model', 'zoo:bert-48', '--cluster', 'automap-b', '--planner', 'automap-infer', "
            "'--json']) == 0\n"
            "print(sorted(m for m in ('torch', 'numba', 'gymnasium', 'scipy', 'networkx') if m in sys.modules), "
            "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "[]"


def test_on_thousands_of_operators_the_agent_plans_where_spp_refuses() -> None:
    """benchmarks/automap/large.py's premise, small: a 2,697-operator graph on 32 GPUs is a
    plan for the shipped agent, while spp refuses it up front with its time estimate."""
    from pipeplan.errors import Infeasible

    graph = load_graph("zoo:bert-large?layers=192&granularity=op")
    cluster = load_cluster("hier:servers=4,gpus=8,intra=2400Gbps,inter=200Gbps,kind=A100")
    plan, result = run_planner("automap-infer", graph, cluster, PlanOptions(microbatches=16))
    assert len(plan.stages) == 4 and result.iteration_s > 0
    with pytest.raises(Infeasible, match=r"spp: 2,697 layers .* would take it about"):
        run_planner("spp", graph, cluster, PlanOptions(microbatches=16))


# -- beyond 32 GPUs: device cuts by whole servers ----------------------------------------------

def _chain(n: int, seed: int) -> Graph:
    """A chain whose layers' backward is twice their forward, as the abstract problem has it."""
    from pipeplan.graph.model import NodeSpec

    rng = np.random.default_rng(seed)
    fwd = rng.uniform(1e-3, 3e-3, n)
    nodes = [NodeSpec(f"l{i}", fwd[i], 2 * fwd[i], float(rng.uniform(1e6, 5e7)), float(rng.uniform(1e6, 2e7)))
             for i in range(n)]
    return Graph.from_nodes("chain", nodes, [(f"l{i}", f"l{i + 1}") for i in range(n - 1)])


def test_beyond_32_gpus_device_cuts_count_whole_servers_and_the_value_is_the_real_simulation() -> None:
    """On 8 servers of 8 GPUs the agent cuts in units of one server: unit cuts (1, 4, 6) are
    GPU cuts (8, 32, 48), and the coarse value times the common maximum is the real model's
    simulated iteration on those GPUs (a chain whose backward is twice its forward, as the
    abstract problem splits compute)."""
    g = _chain(300, 0)
    c = hierarchical("8x8", 8, 8, 400e9, 25e9, kind="V100")
    inst = from_graph(g, c, 8, 4)
    assert (inst.unit, inst.units, inst.devices) == (8, 8, 64)
    bounds, dcuts = [30, 60, 90], [1, 4, 6]
    plan = real_plan(g, c, inst, bounds, dcuts, 8)
    assert [s.devices[0] for s in plan.stages] == ["s0g0", "s1g0", "s4g0", "s6g0"]
    assert [len(s.devices) for s in plan.stages] == [8, 24, 16, 16]
    real = simulate(plan).iteration_s
    assert inst.values(np.array([bounds]), np.array([dcuts]))[0] * inst.scale == pytest.approx(real, rel=1e-9)


def test_unit_cuts_coarse_optimum_equals_brute_force_and_the_env_masks_units() -> None:
    """The exact search over unit cuts against brute force on a 6-server (48 GPU) instance;
    the environment offers device cuts 1..units-1 only."""
    rng = np.random.default_rng(3)
    topo = topology(hierarchical("6x8", 6, 8, 400e9, 40e9, kind="V100"))
    c, a, w, pos, top = coarsen(rng.random(12), np.concatenate(([0], rng.random(11), [0])) * 0.2,
                                rng.random(12) * 0.3, points=13)
    inst = Instance(c, a, w, topo, 4, 3, pos, top, unit=8)
    combos = [(b, d) for b in itertools.combinations(range(1, 12), 2) for d in itertools.combinations(range(1, 6), 2)]
    best = inst.values(np.array([b for b, _ in combos]), np.array([d for _, d in combos])).min()
    assert optimum(inst).value == pytest.approx(best, rel=1e-12)
    c, a, w, pos, top = coarsen(rng.random(400), np.concatenate(([0], rng.random(399), [0])) * 0.05,
                                rng.random(400) * 0.02)
    env = InferEnv()
    env.use(Instance(c, a, w, topo, 8, 3, pos, top, unit=8))
    env.load([30], [])
    assert np.flatnonzero(env.mask()).tolist() == [1, 2, 3, 4]  # one unit left for the last stage


@pytest.mark.parametrize("spec, message", [
    ("hier:servers=37,gpus=1,intra=100Gbps,inter=100Gbps", "37 servers cannot be grouped into 2 to 32 equal units"),
    ("hier:servers=5,gpus=8,intra=100Gbps,inter=10Gbps", None),
])
def test_unit_choice_and_refusal(spec: str, message: str | None) -> None:
    cluster = load_cluster(spec)
    graph = load_graph("zoo:bert-large?layers=4")
    if message is None:
        assert from_graph(graph, cluster, 4, 2).unit == 8
        return
    with pytest.raises(PipeplanError, match=message):
        from_graph(graph, cluster, 4, 2)


def test_on_256_gpus_the_agent_plans_on_server_boundaries() -> None:
    """32 servers of 8 GPUs: the shipped agent plans at most 8 stages (its K), each on whole
    servers."""
    graph = load_graph("zoo:bert-large?layers=24")
    cluster = load_cluster("hier:servers=32,gpus=8,intra=2400Gbps,inter=200Gbps,kind=A100")
    plan, result = run_planner("automap-infer", graph, cluster, PlanOptions(microbatches=16))
    assert 2 <= len(plan.stages) <= 8 and result.iteration_s > 0
    assert all(len(s.devices) % 8 == 0 and s.devices[0].endswith("g0") for s in plan.stages)
    assert sum(len(s.devices) for s in plan.stages) == 256
