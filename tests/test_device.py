"""The GPU path's choices and the parts of it that run on a CPU for real (runtime/device.py,
runtime/clock.py): which device and backend a run gets, bf16 autocast in the workers and in
the check's reference, the clock's placement of marks. What needs a GPU is skipped here and
measured by benchmarks/gpu/ (docs/runtime.md says what is unverified without one)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from pipeplan.errors import PipeplanError
from pipeplan.runtime.check import check_run
from pipeplan.runtime.clock import Clock
from pipeplan.runtime.device import Target, resolve
from pipeplan.runtime.executor import RunConfig, run_plan

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu/ measures it)")


def test_auto_takes_a_gpu_for_each_local_process_else_the_cpu():
    assert resolve("auto", "fp32", 4, cuda_count=4) == Target("cuda", "fp32")
    assert resolve("auto", "bf16", 4, cuda_count=2) == Target("cpu", "bf16")
    assert resolve("auto", "fp32", 2, cuda_count=0).backend == "gloo"
    assert resolve("cuda", "fp32", 8, cuda_count=8).backend == "nccl"
    with pytest.raises(PipeplanError, match="needs 4 GPUs on this machine .one a process., 2 visible"):
        resolve("cuda", "fp32", 4, cuda_count=2)
    with pytest.raises(PipeplanError, match="--device must be one of auto, cpu, cuda, got 'tpu'"):
        resolve("tpu", "fp32", 1)
    with pytest.raises(PipeplanError, match="--precision must be one of fp32, bf16, got 'fp8'"):
        resolve("cpu", "fp8", 1)


def test_this_machine_without_cuda_runs_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve("auto", "fp32", 1) == Target("cpu", "fp32")
    with pytest.raises(PipeplanError, match="0 visible"):
        resolve("cuda", "fp32", 1)


def test_bf16_autocast_computes_matrix_products_in_bf16():
    layer = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with Target("cpu", "bf16").autocast():
        assert layer(x).dtype == torch.bfloat16
    with Target("cpu", "fp32").autocast():
        assert layer(x).dtype == torch.float32


def test_a_cpu_clocks_marks_are_host_times():
    clock = Clock(torch.device("cpu"))
    before = time.perf_counter()
    t0 = clock.anchor()
    mark = clock.mark()
    assert before <= t0 <= mark <= time.perf_counter() and clock.seconds(mark) == mark


@CUDA
def test_a_gpu_clock_places_events_on_the_host_clock_by_gpu_time():
    """A kernel of known length (a sleep on the GPU) between two events: their host times are
    after the anchor, in order, apart by at least the sleep."""
    clock = Clock(torch.device("cuda"))
    t0 = clock.anchor()
    a = clock.mark()
    torch.cuda._sleep(50_000_000)  # cycles: tens of milliseconds on any GPU
    b = clock.mark()
    clock.sync()
    assert t0 <= clock.seconds(a) < clock.seconds(b) <= time.perf_counter()
    assert clock.seconds(b) - clock.seconds(a) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("split", [None, 2], ids=["pipelines", "uneven"])
def test_bf16_runs_match_bf16_training_in_one_process_and_not_fp32(split):
    """Two pipelines of two stages on torch's pipelining, or SPP's uneven 2-1 replication on
    pipeplan's own executor, trained with bf16 autocast: the weights equal the same training
    in one process with autocast, and differ from fp32 training by far more than the
    tolerance (the workers did compute in bf16)."""
    from test_runtime import plan_for

    from pipeplan.plan import Stage

    plan = plan_for("1f1b", "round-robin", 4, 4, spec="example:transformer")
    plan.graph.meta["microbatch"] = 2  # bf16 is slow on a CPU: 2 samples a microbatch (1 a split replica)
    if split:
        c = plan.cluster
        plan.stages = [Stage(plan.stages[0].nodes, c.names[:2]), Stage(plan.stages[1].nodes, c.names[2:3])]
    cfg = RunConfig("example:transformer", steps=1, warmup=0, precision="bf16", device="cpu", timeout_s=600)
    out = run_plan(plan, cfg)
    assert (out.device, out.precision) == ("cpu", "bf16")
    kw = dict(steps=1, lr=cfg.lr, seed=cfg.seed, threads=1, microbatch=out.microbatch)
    same = check_run(plan, cfg.spec, out.params, precision="bf16", **kw)
    fp32 = check_run(plan, cfg.spec, out.params, precision="fp32", **kw)
    assert same.verdict == "pass", same
    assert fp32.verdict == "fail" and fp32.max_rel_diff > 100 * fp32.tolerance, fp32
