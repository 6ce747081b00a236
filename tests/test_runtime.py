"""The executor: IR -> torch.distributed.pipelining translation, --check, failures."""

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.pipelining.schedules import FULL_BACKWARD, _Action, _PipelineScheduleRuntime

from pipeplan.cluster import hierarchical
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.executor import RunConfig, max_rel_diff, reference_params, run_plan
from pipeplan.runtime.models import load_model
from pipeplan.runtime.translate import pipeline_orders
from pipeplan.schedule import make_schedule

pytestmark = pytest.mark.slow  # worker processes: seconds each


def model_graph(spec: str = "example:mlp") -> tuple[Graph, list[str], int]:
    model, x = load_model(spec)
    names = [n for n, _ in model.named_children()]
    n = len(names)
    g = Graph(name="m", ids=names, fwd=[1e-3] * n, bwd=[2e-3] * n, params=[0.0] * n, act=[1e4] * n,
              flops=[float("nan")] * n, desc=[""] * n, edges=[(i, i + 1) for i in range(n - 1)],
              meta={"microbatch": int(x.shape[0])})
    return g, names, int(x.shape[0])


class _FakeStage:
    """Just what torch's schedules read to build their action lists."""

    def __init__(self, n_stages: int, rank: int) -> None:
        self.num_stages, self.group_size, self.group_rank = n_stages, n_stages, rank
        self.stage_index, self.is_first, self.is_last = rank, rank == 0, rank == n_stages - 1
        self.submod = torch.nn.Identity()


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "spp-pe"])
@pytest.mark.parametrize("stages,m", [(2, 4), (3, 5), (4, 8), (4, 2)])
def test_translation_is_the_ir_and_torch_lowers_it(name, stages, m):
    devs = [[s] for s in range(stages)]
    sched = make_schedule(name, devs, m)
    order = pipeline_orders(sched, devs, "split")[0]
    for s in range(stages):
        ir = [a for a in sched.programs[s].actions() if a != "AR"]
        assert [f"{a.computation_type.value}{a.microbatch_index}" for a in order[s]] == ir
        assert all(a.stage_index == s for a in order[s])
    rt = _PipelineScheduleRuntime([_FakeStage(stages, 0)], n_microbatches=m)
    rt._prepare_schedule_with_comms(order)  # torch inserts the sends and receives
    lowered = rt.pipeline_order_with_comms
    for s in range(stages):
        kinds = [a.computation_type.value for a in lowered[s]]
        assert kinds.count("SEND_F") == (m if s < stages - 1 else 0)
        assert kinds.count("RECV_B") == (m if s < stages - 1 else 0)
        assert kinds.count("RECV_F") == (m if s > 0 else 0)


def test_round_robin_pipelines_renumber_their_microbatches():
    devs = [[0, 1], [2, 3]]
    orders = pipeline_orders(make_schedule("1f1b", devs, 6, "round-robin"), devs, "round-robin")
    assert len(orders) == 2
    for order in orders:  # each pipeline runs 3 microbatches, numbered 0..2
        assert sorted(a.microbatch_index for a in order[1] if a.computation_type == FULL_BACKWARD) == [0, 1, 2]
    assert orders[0][1][:2] == [_Action(1, orders[0][1][0].computation_type, 0), _Action(1, FULL_BACKWARD, 0)]


def plan_for(schedule: str, replicas: str, split_at: int | None, devices: int, m: int = 4) -> Plan:
    g, names, _ = model_graph()
    c = hierarchical("local", 1, devices, 1e9, 1e9)
    if split_at is None:
        stages = [Stage(names, c.names)]
    else:
        half = devices // 2
        stages = [Stage(names[:split_at], c.names[:half]), Stage(names[split_at:], c.names[half:])]
    return Plan(g, c, stages, m, schedule=schedule, replicas=replicas)


@pytest.mark.parametrize("schedule,replicas,split_at,devices", [
    ("gpipe", "split", 7, 2), ("1f1b", "split", 7, 2), ("spp-pe", "split", 7, 2),
    ("1f1b", "split", None, 2), ("1f1b", "round-robin", None, 2)])
def test_check_matches_one_process_training(schedule, replicas, split_at, devices):
    plan = plan_for(schedule, replicas, split_at, devices)
    cfg = RunConfig("example:mlp", steps=2, timeout_s=120)
    out = run_plan(plan, cfg)
    assert out["measured_s"] > 0 and out["predicted_s"] > 0
    staged = out.pop("_params")
    assert max_rel_diff(staged, reference_params(plan, cfg, 64)) <= 1e-5
    # the check can fail: a reference trained one step more is far away
    assert max_rel_diff(staged, reference_params(plan, RunConfig("example:mlp", steps=3), 64)) > 1e-4


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("factory,fragment", [("dies", "died with exit code"), ("raises", "raised RuntimeError"),
                                              ("hangs", "did not finish within")])
def test_failing_worker_ends_the_run(factory, fragment):
    plan = plan_for("1f1b", "split", 7, 2)
    cfg = RunConfig(f"failing_models:{factory}", steps=2, timeout_s=8)
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(PipeplanError, match=fragment) as err:
        run_plan(plan, cfg)
    assert "rank 1 (stage 1, device s0g1)" in str(err.value) or factory == "hangs"
    assert "rank" in str(err.value)
    leftover = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not leftover and not any(_alive(p.pid) for p in leftover)


def test_plan_not_matching_the_model_is_refused_before_start():
    plan = plan_for("1f1b", "split", 7, 2)
    plan.stages[0].nodes = ["ghost"] + plan.stages[0].nodes[1:]
    with pytest.raises(PipeplanError):
        Plan(plan.graph, plan.cluster, plan.stages, 4)  # the plan itself is invalid
    g, names, _ = model_graph("example:cnn")  # a plan for another model
    c = hierarchical("local", 1, 2, 1e9, 1e9)
    other = Plan(g, c, [Stage(names[:5], ["s0g0"]), Stage(names[5:], ["s0g1"])], 4)
    with pytest.raises(PipeplanError, match="does not match model"):
        run_plan(other, RunConfig("example:transformer"))
    uneven = plan_for("1f1b", "split", 7, 3)
    with pytest.raises(PipeplanError, match="same number of devices"):
        run_plan(uneven, RunConfig("example:mlp"))


@pytest.mark.parametrize("schedule", ["async-1f1b", "fb-parallel"])
def test_steady_state_schedules_are_refused_before_start(schedule, tmp_path):
    plan = plan_for(schedule, "split", 7, 2)
    plan.save(tmp_path / "p.json")
    proc = subprocess.run([sys.executable, "-m", "pipeplan", "run", str(tmp_path / "p.json"), "--model", "example:mlp"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "synchronous schedules" in proc.stderr and schedule in proc.stderr


def test_recomputation_trains_the_same_parameters():
    plan = plan_for("gpipe", "split", 7, 2)
    plan.recompute = [True, False]
    cfg = RunConfig("example:mlp", steps=2, timeout_s=120)
    out = run_plan(plan, cfg)
    assert max_rel_diff(out.pop("_params"), reference_params(plan, cfg, 64)) <= 1e-5


def test_cli_run_check(tmp_path):
    plan = plan_for("1f1b", "split", 7, 2)
    plan.save(tmp_path / "p.json")
    proc = subprocess.run([sys.executable, "-m", "pipeplan", "run", str(tmp_path / "p.json"), "--model", "example:mlp",
                           "--steps", "2", "--check", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["max_rel_diff"] <= 1e-5 and out["measured_s"] > 0 and out["predicted_s"] > 0
