"""The executor: IR -> torch.distributed.pipelining translation, --check, failures."""

import json
import multiprocessing
import time

import numpy as np
import pytest
import torch
from torch.distributed.pipelining.schedules import FULL_BACKWARD, _Action, _PipelineScheduleRuntime

from pipeplan.cli import main
from pipeplan.cluster import hierarchical
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.check import check_run, compare_states, reference_state
from pipeplan.runtime.executor import RunConfig, RunResult, run_plan
from pipeplan.runtime.models import load_model
from pipeplan.runtime.translate import pipeline_orders
from pipeplan.schedule import Kind, make_schedule

from helpers import process_alive

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


def plan_for(schedule: str, replicas: str, split_at: int | None, devices: int, m: int = 4,
             spec: str = "example:mlp") -> Plan:
    g, names, _ = model_graph(spec)
    c = hierarchical("local", 1, devices, 1e9, 1e9)
    if split_at is None:
        stages = [Stage(names, c.names)]
    else:
        half = devices // 2
        stages = [Stage(names[:split_at], c.names[:half]), Stage(names[split_at:], c.names[half:])]
    return Plan(g, c, stages, m, schedule=schedule, replicas=replicas)


def assert_causal(out: RunResult, plan: Plan) -> None:
    """The measured timeline holds every F and B once per device and microbatch, each B after
    its F, and a stage's F(m) after the previous stage's F(m) ended (its input comes from
    there), a backward before the previous stage's B(m) starts."""
    tl = out.timeline
    seen = {}
    for k, s, m, r, a, b in zip(tl.kind, tl.stage, tl.micro, tl.resource, tl.start, tl.end):
        seen.setdefault((int(s), int(m), int(k)), []).append((float(a), float(b)))
        assert b >= a
    for s, st in enumerate(plan.stages):
        for m in range(plan.microbatches):
            f, bw = seen[(s, m, 0)], seen[(s, m, 1)]
            assert min(a for a, _ in bw) >= min(a for a, _ in f)
            if s:
                assert min(a for a, _ in f) >= min(b for _, b in seen[(s - 1, m, 0)]) - 1e-3
                assert max(b for _, b in bw) <= max(b for _, b in seen[(s - 1, m, 1)]) + 1e-3


def reference(plan: Plan, cfg: RunConfig, microbatch: int, extra_steps: int = 0) -> dict:
    return reference_state(plan, cfg.spec, cfg.warmup + cfg.steps + extra_steps, cfg.lr, cfg.seed, cfg.threads,
                           microbatch)


@pytest.mark.parametrize("schedule,replicas,split_at,devices", [
    ("gpipe", "split", 7, 2)])  # 1f1b and spp-pe: the BatchNorm, skip-edge and HF tests run them
def test_check_matches_one_process_training(schedule, replicas, split_at, devices):
    """(The gpipe plan re-materializes its first stage: torch.utils.checkpoint.)"""
    plan = plan_for(schedule, replicas, split_at, devices)
    plan.recompute = [True, False] if schedule == "gpipe" else None
    cfg = RunConfig("example:mlp", steps=2, timeout_s=600)
    out = run_plan(plan, cfg, 0.5)
    assert out.measured_s > 0 and out.predicted_s == 0.5 and out.error == abs(0.5 - out.measured_s) / out.measured_s
    staged = out.params
    assert_causal(out, plan)
    assert compare_states(staged, reference(plan, cfg, 64))[0] <= 1e-5
    # the check can fail: a reference trained one step more is far away
    assert compare_states(staged, reference(plan, cfg, 64, extra_steps=1))[0] > 1e-4



@pytest.mark.parametrize("factory,fragment", [("dies", "died with exit code"), ("raises", "raised RuntimeError"),
                                              ("hangs", "made no progress for")])
def test_failing_worker_ends_the_run(factory, fragment):
    plan = plan_for("1f1b", "split", 7, 2)
    cfg = RunConfig(f"failing_models:{factory}", steps=2, hang_s=3)
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(PipeplanError, match=fragment) as err:
        run_plan(plan, cfg)
    assert "rank 1 (stage 1, device s0g1)" in str(err.value)
    assert "rank" in str(err.value)
    leftover = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not leftover and not any(process_alive(p.pid) for p in leftover)


class _FakeProcess:
    exitcode: int | None = None


def test_a_worker_setting_up_is_not_taken_for_a_hang():
    """Hang detection counts from progress: a rank still building its stage (its last report
    a set-up step) has STARTUP_GRACE_S more, however slowly a loaded machine gets there; the
    run ends normally once every report is in. (The launcher's watch, as the executor runs it.)"""
    import queue

    from pipeplan.runtime.launch import Done, Progress, watch

    procs = [_FakeProcess(), _FakeProcess()]

    class Reports(queue.Queue):
        """The ranks' reports: both finish once watch found no report 3 times, every time
        long after hang_s without progress."""

        quiet = 0

        def get(self, block=True, timeout=None):
            try:
                return super().get(block, timeout)
            except queue.Empty:
                self.quiet += 1
                if self.quiet == 3:
                    for r in (0, 1):
                        self.put(Done(r, {"steps": [{"seconds": 1.0}], "params": {r: {}}}))
                        procs[r].exitcode = 0
                raise

    results = Reports()
    long_ago = time.time() - 5
    results.put(Progress(0, "joined the process group", long_ago))
    results.put(Progress(1, "joined the process group", long_ago))
    done = watch(procs, results, hang_s=0.5)
    assert sorted(done) == [0, 1] and results.quiet >= 3


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


def test_steady_state_schedules_are_refused_before_start(tmp_path, capsys):
    with pytest.raises(PipeplanError, match="'async-1f1b' is evaluated as an asynchronous steady state"):
        run_plan(plan_for("async-1f1b", "split", 7, 2), RunConfig("example:mlp"))
    schedule = "fb-parallel"  # and through the command line: one line, exit 2
    plan = plan_for(schedule, "split", 7, 2)
    plan.save(tmp_path / "p.json")
    assert main(["run", str(tmp_path / "p.json"), "--model", "example:mlp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "synchronous schedules" in err and schedule in err


def test_cli_run_check(tmp_path, capsys):
    plan = plan_for("1f1b", "split", 7, 2)
    plan.save(tmp_path / "p.json")
    code = main(["run", str(tmp_path / "p.json"), "--model", "example:mlp", "--steps", "2", "--check", "--json",
                 "--trace", str(tmp_path / "m.json"), "--gantt", str(tmp_path / "m.png"), "--vs-prediction"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG" and json.loads((tmp_path / "m.json").read_text())
    assert list(out) == ["measured_s", "predicted_s", "error", "steps", "warmup", "processes", "per_step_s", "spread",
                         "schedule", "replicas", "microbatch", "device", "precision", "warnings", "timeline_step",
                         "action_error",
                         "max_rel_diff", "check"]  # RunResult.to_dict: the keys and order run_plan's dict had
    errors = out["action_error"]
    assert set(errors["summary"]) == {"forward", "backward"} and len(errors["actions"]) == 2 * 2 * 4
    assert out["max_rel_diff"] <= 1e-5 and out["measured_s"] > 0 and out["predicted_s"] > 0
    assert out["check"]["verdict"] == "pass" and out["check"]["tolerance"] == 1e-5


def test_cli_check_that_fails_exits_1(tmp_path, capsys):
    plan = plan_for("1f1b", "split", 3, 2, spec="runtime_models:rank_skewed")
    plan.save(tmp_path / "p.json")
    code = main(["run", str(tmp_path / "p.json"), "--model", "runtime_models:rank_skewed", "--steps", "1", "--check",
                 "--json"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    check = json.loads(captured.out)["check"]
    assert check["verdict"] == "fail" and check["max_rel_diff"] > 1e-3


@pytest.mark.parametrize("schedule,replicas,split_at,devices", [
    ("spp-pe", "split", 2, 2), ("1f1b", "split", None, 2), ("1f1b", "round-robin", None, 2)])
def test_batchnorm_buffers_and_a_stage_starting_in_place(schedule, replicas, split_at, devices):
    """Stage 1 of the split at 2 starts with ReLU(inplace=True) on what it received; every
    BatchNorm's running statistics after the run equal one-process training's, replica by
    replica (a split replica normalizes its half of each microbatch)."""
    plan = plan_for(schedule, replicas, split_at, devices, spec="runtime_models:bn_cnn")
    cfg = RunConfig("runtime_models:bn_cnn", steps=2, timeout_s=600)
    out = run_plan(plan, cfg)
    staged = out.params
    names = {n for st in staged.values() for n in st}
    assert {"1.running_mean", "1.running_var", "4.running_mean"} <= names
    assert all(torch.isfinite(torch.as_tensor(t)).all() for st in staged.values() for t in st.values())
    got = check_run(plan, cfg.spec, staged, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                    threads=cfg.threads, microbatch=out.microbatch)
    assert got.verdict == "pass", got
    initial = dict(load_model(cfg.spec)[0].state_dict())
    assert float((torch.as_tensor(staged[0]["1.running_mean"]) - initial["1.running_mean"]).abs().max()) > 1e-3


def test_check_says_what_it_cannot_compare():
    """Dropout draws other numbers in every process; a re-materialized BatchNorm updates its
    statistics twice. (The state checked here is the reference's own: only the verdicts differ.)"""
    spec = "runtime_models:dropout_mlp"
    plan = plan_for("1f1b", "split", 2, 2, spec=spec)
    state = reference_state(plan, spec, 1, 0.05, 0, 1, 8)
    got = check_run(plan, spec, {0: state}, steps=1, lr=0.05, seed=0, threads=1, microbatch=8)
    assert got.verdict == "not comparable" and "2" in got.note
    bn = plan_for("gpipe", "split", 3, 2, spec="runtime_models:bn_cnn")
    bn.recompute = [False, True]
    state = reference_state(bn, "runtime_models:bn_cnn", 1, 0.05, 0, 1, 8)
    got = check_run(bn, "runtime_models:bn_cnn", {0: state}, steps=1, lr=0.05, seed=0, threads=1, microbatch=8)
    assert got.verdict == "pass" and got.left_out == ["4.running_mean", "4.running_var", "4.num_batches_tracked"]
    assert "twice" in got.note


def test_check_passes_a_batchnorm_resnet_trained_data_parallel():
    """fp32 summation order alone moved a BatchNorm bias by 4e-5 (tolerance 1e-5) against a
    reference that summed all shares at once; against one that sums as the run does, with
    the tolerance scaled by the rounding measured between the two, the run passes."""
    plan = plan_for("1f1b", "round-robin", None, 2, spec="example:resnet")
    plan.graph.meta["microbatch"] = 8  # half the example's: the rounding is as large (4e-5), the run cheaper
    cfg = RunConfig("example:resnet", steps=3, timeout_s=600)
    out = run_plan(plan, cfg)
    got = check_run(plan, cfg.spec, out.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                    threads=cfg.threads, microbatch=out.microbatch)
    assert got.verdict == "pass", got
    assert got.max_rel_diff <= got.tolerance <= 1e-2


@pytest.mark.parametrize("fault", ["lost", "repeated"])
def test_check_fails_a_lost_or_repeated_microbatch(fault, monkeypatch):
    """A run's state where pipeline 1 skipped its last microbatch, or ran it twice, in every
    step (the one-process training with that fault injected): the check fails, far above its
    tolerance."""
    import pipeplan.runtime.check as check

    spec, steps, z = "example:resnet", 2, 4  # 4 samples a microbatch: still > 1e4 x the tolerance
    plan = plan_for("1f1b", "round-robin", None, 2, spec=spec)
    right = check.microbatches_of

    def faulty(p, k, m_count, replicas):
        ms = list(right(p, k, m_count, replicas))
        return ms if p != 1 else ms[:-1] if fault == "lost" else ms + ms[-1:]

    monkeypatch.setattr(check, "microbatches_of", faulty)
    state = reference_state(plan, spec, steps, 0.05, 0, 1, z, per_pipeline=True)
    monkeypatch.setattr(check, "microbatches_of", right)
    got = check_run(plan, spec, {0: state}, steps=steps, lr=0.05, seed=0, threads=1, microbatch=z)
    assert got.verdict == "fail" and got.max_rel_diff > 10 * got.tolerance, got


@pytest.mark.slow
def test_the_prediction_error_points_at_the_warning_that_explains_it(tmp_path, capsys):
    """A plan for V100s run on this CPU: the warning comes first, and the error line says
    that a warning explains it."""
    plan_for("1f1b", "split", 7, 2).save(tmp_path / "p.json")
    assert main(["run", str(tmp_path / "p.json"), "--model", "example:mlp", "--steps", "1", "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    assert "warning: " in err and "'local' (V100)" in err
    assert "prediction error" in out and "warning(s) above say why it may not hold here" in out


def test_a_plan_for_another_cluster_is_warned_about():
    from pipeplan.cluster import Cluster, Device
    from pipeplan.runtime.executor import target_warnings

    gpu = plan_for("1f1b", "split", 7, 2)  # hierarchical(): V100s
    got = target_warnings(gpu, cores=2)
    assert len(got) == 1 and "'local' (V100)" in got[0] and "this machine (2 CPU cores) as 2 CPU processes" in got[0]
    g, names, _ = model_graph()
    cpus = Cluster("here", [Device(f"worker{r}", kind="CPU") for r in range(3)], np.full((3, 3), 1e9), np.zeros((3, 3)))
    plan = Plan(g, cpus, [Stage(names[:3], ["worker0"]), Stage(names[3:6], ["worker1"]), Stage(names[6:], ["worker2"])], 4)
    assert target_warnings(plan, cores=4) == []
    assert target_warnings(plan, cores=2) == ["3 worker processes on 2 cores: they share cores, so times are slower "
                                              "than either the plan or a calibration assumes"]


@pytest.mark.parametrize("spec, cuts, edge", [
    ("runtime_models:residual", [["inp", "act"], ["a"], ["b", "out"]], ("act", "out")),
    # one nn.ReLU called twice, a layer per call: the cut falls between its calls
    ("test_profiler:basic_block", [["conv1", "bn1", "relu", "conv2", "bn2"], ["relu#2", "pool", "fc"]],
     ("bn2", "relu#2")),
])
def test_any_module_with_a_skip_edge_across_stages(spec, cuts, edge):
    """The profiler's graph of a non-Sequential module (edges act -> a and act -> out) is the
    graph the executor splits; the skip value h crosses the first cut beside a's input and is
    relayed over the second."""
    from pipeplan.runtime.profiler import profile_model

    g = profile_model(spec, warmup=0, reps=1)
    assert edge in [(g.ids[u], g.ids[v]) for u, v in g.edges]
    c = hierarchical("local", 1, len(cuts), 1e9, 1e9)
    plan = Plan(g, c, [Stage(ns, [d]) for ns, d in zip(cuts, c.names)], 4, schedule="1f1b")
    cfg = RunConfig(spec, steps=2, timeout_s=600)
    out = run_plan(plan, cfg)
    got = check_run(plan, spec, out.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                    threads=cfg.threads, microbatch=out.microbatch)
    assert got.verdict == "pass", got


def test_a_plan_against_the_data_flow_is_refused_before_start():
    """A graph file that lost its edges lets a plan put b before a; the runtime's own split
    of the model refuses it, naming the layer."""
    spec = "runtime_models:residual"
    ids = ["inp", "act", "a", "b", "out"]
    g = Graph(name="m", ids=ids, fwd=[1e-3] * 5, bwd=[2e-3] * 5, params=[0.0] * 5, act=[1e4] * 5,
              flops=[float("nan")] * 5, desc=[""] * 5, edges=[], meta={"microbatch": 8})
    c = hierarchical("local", 1, 2, 1e9, 1e9)
    plan = Plan(g, c, [Stage(["inp", "act", "b"], ["s0g0"]), Stage(["a", "out"], ["s0g1"])], 4, schedule="1f1b")
    with pytest.raises(PipeplanError, match="stage 0 runs 'b', which needs a value computed in stage 1"):
        run_plan(plan, RunConfig(spec))


@pytest.mark.parametrize("replicas,devices", [("split", [2, 1]), ("round-robin", [1, 2])])
def test_uneven_replication_redistributes_and_trains_as_one_process(replicas, devices):
    """Stages on 2 and 1 devices (and 1 and 2): pipeplan's own executor moves each share's
    rows between the groups; the parameters equal one-process training, and not one step
    more of it."""
    g, names, z = model_graph()
    c = hierarchical("local", 1, 3, 1e9, 1e9)
    plan = Plan(g, c, [Stage(names[:7], c.names[:devices[0]]), Stage(names[7:], c.names[devices[0]:])], 4,
                schedule="1f1b", replicas=replicas)
    cfg = RunConfig("example:mlp", steps=2, timeout_s=600)
    out = run_plan(plan, cfg)
    staged = out.params
    assert_causal(out, plan)
    tl = out.timeline
    channels = [n for n, dev in zip(tl.resources, tl.resource_is_device) if not dev]
    assert channels == ["ch:0-1", "ch:1-0"]  # every receive drawn on its channel
    assert int((tl.resource == tl.resources.index("ch:0-1")).sum()) == 4  # one receive per microbatch
    # the replicated stage's devices all-reduce, every device steps its optimizer, once each
    assert int((tl.kind == Kind.AR).sum()) == 2 and int((tl.kind == Kind.UPDATE).sum()) == 3
    got = check_run(plan, cfg.spec, staged, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                    threads=cfg.threads, microbatch=z)
    assert got.verdict == "pass", got
    assert compare_states(staged, reference(plan, cfg, z, extra_steps=1))[0] > 1e-4
