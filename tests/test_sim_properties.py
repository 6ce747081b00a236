"""Properties of the simulator over random graphs, clusters and plans."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.cluster import Cluster, Device
from pipeplan.graph import Graph, linearize
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate
from pipeplan.schedule import Kind
ALLREDUCE, BWD, COMM_B, COMM_F, FWD = Kind.AR, Kind.B, Kind.SEND_B, Kind.SEND_F, Kind.F

EPS = 1e-9


@st.composite
def random_plans(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 10))
    edges = [(i, i + 1) for i in range(n - 1)] if draw(st.booleans()) else []
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < 0.25:
                edges.append((u, v))
    g = Graph(name="rand", ids=[f"n{i}" for i in range(n)], fwd=rng.uniform(0, 1, n),
              bwd=rng.uniform(0, 2, n), params=rng.uniform(0, 1e6, n) * (rng.random(n) < 0.7),
              act=rng.uniform(0, 1e6, n), flops=np.full(n, np.nan), desc=[""] * n, edges=edges)
    v = draw(st.integers(1, 6))
    bw = rng.uniform(1e8, 1e9, (v, v))
    lat = rng.uniform(0, 1e-3, (v, v)) * (rng.random() < 0.5)
    c = Cluster("rand", [Device(f"d{i}", speed=float(rng.uniform(0.5, 2))) for i in range(v)], bw, lat)
    lin = linearize(g)
    s_count = draw(st.integers(1, min(n, v)))
    cuts = np.sort(rng.choice(np.arange(1, n), size=s_count - 1, replace=False)) if s_count > 1 else []
    bounds = [0, *[int(x) for x in cuts], n]
    # give each stage >= 1 device, the rest at random (some may stay unused)
    perm = list(rng.permutation(v))
    counts = [1] * s_count
    for _ in range(int(rng.integers(0, v - s_count + 1))):
        counts[int(rng.integers(0, s_count))] += 1
    stages, d = [], 0
    for k in range(s_count):
        stages.append(Stage([g.ids[u] for u in lin.interval(bounds[k], bounds[k + 1])],
                            [c.devices[i].name for i in perm[d:d + counts[k]]]))
        d += counts[k]
    m = draw(st.integers(1, 8))
    sched = draw(st.sampled_from(["gpipe", "1f1b"]))
    replicas = draw(st.sampled_from(["split", "round-robin"]))
    return Plan(g, c, stages, m, schedule=sched, replicas=replicas)


@settings(max_examples=150, deadline=None)
@given(random_plans())
def test_timeline_invariants(plan):
    r = simulate(plan)
    tl = r.timeline
    # no resource (device or channel) does two things at once
    for res in range(len(tl.resources)):
        idx = tl.tasks_on(res)
        assert np.all(tl.start[idx][1:] >= tl.end[idx][:-1] - EPS)
    assert np.all(tl.end >= tl.start)
    # dependencies
    ends: dict = {}
    starts: dict = {}
    for k, s, m, a, b in zip(tl.kind, tl.stage, tl.micro, tl.start, tl.end):
        key = (int(k), int(s), int(m))
        ends[key] = max(ends.get(key, 0.0), b)
        starts[key] = min(starts.get(key, np.inf), a)
    s_count = plan.num_stages
    for m in range(plan.microbatches):
        for s in range(s_count):
            assert starts[(BWD, s, m)] >= ends[(FWD, s, m)] - EPS
            if s + 1 < s_count:
                if (COMM_F, s, m) in starts:
                    assert starts[(COMM_F, s, m)] >= ends[(FWD, s, m)] - EPS
                    assert starts[(FWD, s + 1, m)] >= ends[(COMM_F, s, m)] - EPS
                    assert starts[(COMM_B, s + 1, m)] >= ends[(BWD, s + 1, m)] - EPS
                    assert starts[(BWD, s, m)] >= ends[(COMM_B, s + 1, m)] - EPS
                else:
                    assert starts[(FWD, s + 1, m)] >= ends[(FWD, s, m)] - EPS
                    assert starts[(BWD, s, m)] >= ends[(BWD, s + 1, m)] - EPS
        for s in range(s_count):
            if (ALLREDUCE, s, -1) in starts:
                assert starts[(ALLREDUCE, s, -1)] >= ends[(BWD, s, m)] - EPS
    # the iteration is never below the lower bound, and is the last task's end
    assert r.iteration_s >= r.lower_s - EPS
    assert r.iteration_s == tl.end.max()
    assert 0 < r.efficiency <= 1 + 1e-9
    # every microbatch is computed exactly once per stage in total (shares add up to 1)
    work = np.zeros(s_count)
    sp = plan.cluster.speed
    for k, s, res, a, b in zip(tl.kind, tl.stage, tl.resource, tl.start, tl.end):
        if k in (FWD, BWD):
            dev = plan.cluster.index[tl.resources[res]]
            work[s] += (b - a) * sp[dev]
    owner = plan.stage_of_node()
    for s in range(s_count):
        slow = min(sp[plan.cluster.index[d]] for d in plan.stages[s].devices)
        expected = plan.microbatches * float((plan.graph.fwd + plan.graph.bwd)[owner == s].sum())
        # lockstep replicas run at the slowest one's pace, so faster ones "spend" more
        assert work[s] >= expected * (1 - 1e-9) - EPS
        if all(sp[plan.cluster.index[d]] == slow for d in plan.stages[s].devices):
            assert np.isclose(work[s], expected)


def test_the_slowest_link_is_the_same_found_either_way(monkeypatch):
    """sim/durations.py finds a group's slowest link by masking the whole link matrix (small
    clusters) or among each candidate's own devices (large ones): the same numbers."""
    import numpy as np

    from pipeplan.cluster import Cluster
    from pipeplan.cluster.model import Device
    from pipeplan.sim import durations

    rng = np.random.default_rng(0)
    v = 12
    bw, lat = rng.uniform(1e9, 1e10, (v, v)), rng.uniform(0, 1e-5, (v, v))
    cl = Cluster("r", [Device(f"d{i}", "V100", 1e10, 1.0) for i in range(v)], bw, lat)
    a, b = rng.random((20, v)) < 0.3, rng.random((20, v)) < 0.3
    a[0], b[1] = False, False  # an empty side: inf and 0
    dense = durations._slowest(a, b, cl)
    monkeypatch.setattr(durations, "_DENSE_DEVICES", 0)
    per_candidate = durations._slowest(a, b, cl)
    assert np.array_equal(dense[0], per_candidate[0]) and np.array_equal(dense[1], per_candidate[1])
    assert dense[0][0] == np.inf and dense[1][1] == 0.0


class _Raised(Exception):
    pass


def _raise(signum, frame):
    raise _Raised(signum)


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_kernels_compile_is_held_then_delivered(signum):
    """numba's compilation runs llvmlite ctypes callbacks that would swallow the exception a
    signal handler raises (the command ran on, exit 0): errors.interrupts_deferred holds a
    Ctrl-C or SIGTERM, then calls the handler that was in place, once, for the first."""
    import os
    import signal

    from pipeplan.errors import interrupts_deferred

    signum = getattr(signal, signum)
    reached = False
    # Python's own SIGINT handler, as in a terminal (a run started in the background ignores
    # SIGINT); for SIGTERM one that raises, as the CLI's does
    handler = signal.default_int_handler if signum == signal.SIGINT else _raise
    outer = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else _Raised):
            with interrupts_deferred():
                os.kill(os.getpid(), signum)
                os.kill(os.getpid(), signum)
                reached = True  # not interrupted inside the block
        assert reached and signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is handler
    finally:
        for s, h in outer.items():
            signal.signal(s, h)


_RANDOM_TASKS = '''
import json, sys
import numpy as np
from pipeplan.sim import engine

def graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b})
    succ = [[b for a, b in edges if a == i] for i in range(n)]
    ptr = np.cumsum([0] + [len(s) for s in succ])
    npred = np.bincount([b for _, b in edges], minlength=n)
    chan = np.where(rng.random(n) < 0.4, rng.integers(0, 3, n), -1)
    table = np.round(rng.random((4, 5)) * 10, 1)  # ties: equal times, broken by task id
    cls = rng.integers(0, 5, n)
    return table, cls, ptr, np.array([b for s in succ for b in s], dtype=np.int64), npred, chan

out = []
for seed in range(30):
    table, cls, ptr, succ, npred, chan = graphs(seed)
    end, done = engine.run_batch(table, cls, ptr, succ, npred, chan, 3)
    start, end1, done1 = engine.run_tasks(table[0, cls], ptr, succ, npred, chan, 3)
    out.append([end.tolist(), done.tolist(), start.tolist(), end1.tolist(), done1])
print(json.dumps({"numba_loaded": "numba" in sys.modules, "runs": out}))
'''


@pytest.mark.slow
def test_small_runs_as_python_equal_the_compiled_kernels():
    """30 random task graphs with channels and tied times, run by the kernels as Python (a
    fresh process, where small calls never load numba) and compiled (another, which compiles
    them first): the same start and end times, bit for bit."""
    import json
    import subprocess
    import sys

    def run(code: str) -> dict:
        return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout)

    python = run(_RANDOM_TASKS)
    compiled = run(_RANDOM_TASKS.replace("out = []", "engine._compile()\nout = []"))
    assert python["numba_loaded"] is False and compiled["numba_loaded"] is True
    assert compiled["runs"] == python["runs"]
