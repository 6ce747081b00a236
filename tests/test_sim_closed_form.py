"""Closed-form cases for the simulator."""

import math

import numpy as np
import pytest

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.schedule import make_schedule
from pipeplan.sim import simulate

from helpers import chain_plan, one_server, uniform_chain


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,m", [(1, 1), (1, 5), (2, 1), (3, 4), (4, 8), (5, 3), (8, 32)])
def test_uniform_pipeline(schedule, stages, m):
    f, b = 0.3, 0.7
    g = uniform_chain(2 * stages, f / 2, b / 2)  # two layers per stage
    p = chain_plan(g, one_server(stages), list(range(0, 2 * stages + 1, 2)), [1] * stages, m, schedule)
    r = simulate(p)
    assert r.iteration_s == pytest.approx((m + stages - 1) * (f + b))
    assert r.lower_s <= r.iteration_s + 1e-12


@pytest.mark.parametrize("v,m", [(1, 4), (2, 4), (4, 9), (4, 3), (8, 32)])
def test_data_parallel(v, m):
    f, b, params, bw = 0.2, 0.5, 1e6, 2e9
    g = uniform_chain(3, f, b, params=params)
    c = one_server(v, bw)
    p = Plan(g, c, [Stage(g.ids, c.names)], m, schedule="1f1b", replicas="round-robin")
    r = simulate(p)
    expected = math.ceil(m / v) * 3 * (f + b) + 2 * (v - 1) / v * 3 * params / bw
    assert r.iteration_s == pytest.approx(expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("replicas", ["split", "round-robin"])
def test_one_device(schedule, replicas):
    g = uniform_chain(5, 0.1, 0.25, params=10.0, act=100.0)
    p = chain_plan(g, one_server(1), [0, 5], [1], 7, schedule)
    p.replicas = replicas
    assert simulate(p).iteration_s == pytest.approx(7 * 5 * 0.35)


def test_one_microbatch_path_with_transfers():
    """M = 1: forward through all stages, backward back, each cut crossed twice."""
    s, f, b, act, bw, lat = 4, 0.1, 0.2, 3e6, 1e9, 1e-4
    g = uniform_chain(s, f, b, act=act)
    c = hierarchical("c", 1, s, bw, bw, latency=lat)
    for sched in ("gpipe", "1f1b"):
        r = simulate(chain_plan(g, c, list(range(s + 1)), [1] * s, 1, sched))
        assert r.iteration_s == pytest.approx(s * (f + b) + 2 * (s - 1) * (act / bw + lat))
        assert r.path_bound_s == pytest.approx(r.iteration_s)


def test_replicated_stage_split_and_transfer():
    """Stage 0 on 2 devices, stage 1 on 3: compute halves/thirds, transfer is d / (2*3*bw)."""
    f, b, act, params, bw = 0.6, 1.2, 6e6, 4e6, 1e9
    g = uniform_chain(2, f, b, params=params, act=act)
    c = one_server(5, bw)
    r = simulate(chain_plan(g, c, [0, 1, 2], [2, 3], 1, "gpipe"))
    comm = act / (2 * 3 * bw)
    ar0 = 2 * (2 - 1) / 2 * params / bw
    # F0 (f/2), send, F1+B1 (1.8/3), send back, B0 (b/2), then stage 0's all-reduce
    t_b0_end = f / 2 + comm + (f + b) / 3 + comm + b / 2
    assert r.iteration_s == pytest.approx(max(t_b0_end + ar0, f / 2 + comm + (f + b) / 3 + 2 * (3 - 1) / 3 * params / bw))


def test_speed_scales_compute():
    g = uniform_chain(2, 1.0, 2.0)
    c = hierarchical("c", 1, 1, 1e9, 1e9, speed=2.0)
    assert simulate(chain_plan(g, c, [0, 2], [1], 3, "gpipe")).iteration_s == pytest.approx(3 * 6 / 2.0)


def test_memory_follows_schedule():
    """1F1B keeps min(S - s, M) microbatches in flight on stage s; GPipe keeps all M; each
    backward step adds its gradient pair (w.r.t. the layer's output and input; the first
    layer's input needs none)."""
    s_count, m, act, params = 4, 8, 1000.0, 10.0
    g = uniform_chain(s_count, act=act, params=params)
    for sched, inflight in (("1f1b", [min(s_count - s, m) for s in range(s_count)]), ("gpipe", [m] * s_count)):
        r = simulate(chain_plan(g, one_server(s_count), list(range(s_count + 1)), [1] * s_count, m, sched))
        stash = np.array([act] + [2 * act] * (s_count - 1))  # own output (+ received input)
        pair = np.array([act] + [2 * act] * (s_count - 1))
        assert np.allclose(r.memory_bytes, 4 * params + np.array(inflight) * stash + pair)


def test_memory_flags_devices_over_their_limit():
    g = uniform_chain(2, act=2.0**30, params=1.0)
    c = hierarchical("c", 1, 2, 1e9, 1e9, memory=5 * 2.0**30)  # 1F1B: 2 + 1 and 2 + 2 GiB
    r = simulate(chain_plan(g, c, [0, 1, 2], [1, 1], 8, "gpipe"))
    assert r.over_memory == ["s0g0", "s0g1"]
    r = simulate(chain_plan(g, c, [0, 1, 2], [1, 1], 2, "1f1b"))
    assert r.over_memory == []


def test_zero_bandwidth_between_talking_stages():
    from pipeplan.errors import Infeasible

    g = uniform_chain(2, act=1.0)
    c = one_server(2)
    c.bandwidth[0, 1] = c.bandwidth[1, 0] = 0.0
    with pytest.raises(Infeasible, match="zero bandwidth between s0g0 and s0g1"):
        simulate(chain_plan(g, c, [0, 1, 2], [1, 1], 2, "1f1b"))


def test_schedules_are_well_formed():
    devs = [[0, 1], [2], [3, 4, 5]]
    for name, mode in (("gpipe", "split"), ("1f1b", "split"), ("1f1b", "round-robin")):
        sched = make_schedule(name, devs, 7, mode)
        assert len(sched.programs) == 6
        for prog in sched.programs:
            acts = prog.actions()
            assert (acts[-1] == "AR") == (prog.stage != 1)
    one = make_schedule("1f1b", [[0], [1], [2]], 4)
    assert one.programs[0].actions() == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert one.programs[2].actions() == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    # round-robin replicas keep ceil(W_s / k_s) microbatches each in flight (PipeDream's NOAM)
    rr = make_schedule("1f1b", [[0, 1, 2], [3]], 6, "round-robin")
    assert rr.programs[0].actions() == ["F0", "F3", "B0", "B3", "AR"]
    assert rr.programs[1].actions() == ["F1", "F4", "B1", "B4", "AR"]
    assert rr.programs[3].actions() == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4", "B4", "F5", "B5"]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", ["split", "round-robin"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "spp-pe"])
def test_no_replication_pattern_deadlocks(schedule, replicas):
    """Every stage count, replication pattern and M up to 8 runs to completion."""
    import itertools

    g = uniform_chain(4, 1.0, 2.0, act=1e3)
    c = one_server(12)  # 4 stages of up to 3 replicas
    for s_count in range(1, 5):
        for reps in itertools.product(range(1, 4), repeat=s_count):
            cuts = list(range(s_count)) + [4]
            for m in range(1, 9):
                p = chain_plan(g, c, cuts, list(reps), m, schedule)
                p.replicas = replicas
                r = simulate(p, timeline=False)
                assert r.iteration_s >= r.lower_s - 1e-9


def test_optimizer_step_closes_each_device():
    """A profiled update rate adds rate x stage params / speed after each device's last action."""
    s_count, m, f, b, params, rate = 3, 4, 0.1, 0.2, 1e6, 2e-8
    g = uniform_chain(s_count, f, b, params=params)
    base = simulate(chain_plan(g, one_server(s_count), list(range(s_count + 1)), [1] * s_count, m, "1f1b"))
    g.meta["update_s_per_byte"] = rate
    r = simulate(chain_plan(g, one_server(s_count), list(range(s_count + 1)), [1] * s_count, m, "1f1b"))
    assert r.iteration_s == pytest.approx(base.iteration_s + rate * params)
    updates = [k for k in r.timeline.kind if k == 5]
    assert len(updates) == s_count


def test_calibrated_optimizer_step_is_the_clusters():
    """A rate calibrated on the cluster's workers (all stepping at once) replaces the profiled
    one and is not divided by the speeds (it was measured on those devices)."""
    s_count, m, f, b, params, rate = 2, 4, 0.1, 0.2, 1e6, 2e-8
    g = uniform_chain(s_count, f, b, params=params)
    g.meta["update_s_per_byte"] = rate / 10
    c = hierarchical("half speed", 1, s_count, 1e9, 1e9, speed=0.5)
    base = simulate(chain_plan(uniform_chain(s_count, f, b, params=params), c, [0, 1, 2], [1, 1], m, "1f1b"))
    c.meta["update_s_per_byte"] = rate
    r = simulate(chain_plan(g, c, [0, 1, 2], [1, 1], m, "1f1b"))
    assert r.iteration_s == pytest.approx(base.iteration_s + rate * params)


def test_runtime_overhead_per_action():
    """A calibrated per-action overhead o adds to every forward and backward: (M+S-1)(f+b+2o)."""
    s_count, m, f, b, o = 3, 5, 0.1, 0.2, 0.01
    g = uniform_chain(s_count, f, b)
    c = one_server(s_count)
    c.meta["action_overhead_s"] = o
    r = simulate(chain_plan(g, c, list(range(s_count + 1)), [1] * s_count, m, "1f1b"))
    assert r.iteration_s == pytest.approx((m + s_count - 1) * (f + b + 2 * o))


def test_sent_outputs_and_gradient_pairs_closed_form():
    """Linear (output 100 B, kept by nobody in its stage) -> ReLU (keeps its 100 B output) ->
    Linear (10 B), GPipe, M = 2, cut after the first Linear. Stage 0 holds the output it sent
    until its backward: 2 x 100, + its gradient pair 100 (the model's input needs no
    gradient). Stage 1 keeps 100 + 10 of its own + 100 received, per microbatch, + the pair
    100 + 100 of the ReLU. With the ReLU in place (its storage the Linear's, which it keeps),
    cut after the ReLU: stage 0 keeps 100 per microbatch and sends nothing more; its largest
    pair is the ReLU's, 200."""
    g = Graph.chain("c", [1.0] * 3, [1.0] * 3, act=[100.0, 100.0, 10.0], saved=[0.0, 100.0, 10.0])
    assert g.sent_held.tolist() == [100.0, 0.0, 0.0] and g.grad_pair.tolist() == [100.0, 200.0, 110.0]
    r = simulate(chain_plan(g, one_server(2), [0, 1, 3], [1, 1], 2, "gpipe"), timeline=False)
    assert r.memory_bytes.tolist() == pytest.approx([2 * 100 + 100, 2 * (110 + 100) + 200])
    g2 = Graph.chain("c", [1.0] * 3, [1.0] * 3, act=[100.0, 100.0, 10.0], inplace=[False, True, False])
    assert g2.saved.tolist() == [100.0, 0.0, 10.0] and g2.sent_held.tolist() == [0.0, 0.0, 0.0]
    r = simulate(chain_plan(g2, one_server(2), [0, 2, 3], [1, 1], 2, "gpipe"), timeline=False)
    assert r.memory_bytes.tolist() == pytest.approx([2 * 100 + 200, 2 * (10 + 100) + 110])


@pytest.mark.parametrize("v,m,bw", [(2, 8, 1e6), (4, 8, 1e6), (2, 6, 1e12), (4, 12, 2e7)])
@pytest.mark.parametrize("replicas", ["round-robin", "split"])
def test_asynchronous_data_parallelism_synchronizes_once_a_round(v, m, bw, replicas):
    """PipeDream's asynchronous pipeline (SOSP'19 §3.1): replicas all-reduce their gradients
    once a round, overlapping the next round's compute, so per M microbatches a device is busy
    max(compute, rounds x all-reduce): M / v rounds of whole microbatches (round-robin), M of
    shares (split). Ring all-reduce of P bytes over v devices: 2 (v-1)/v P / bandwidth."""
    f, b, params = 0.2, 0.5, 1e6
    g = uniform_chain(3, f, b, params=params)
    c = one_server(v, bw)
    p = Plan(g, c, [Stage(g.ids, c.names)], m, schedule="async-1f1b", replicas=replicas)
    allreduce = 2 * (v - 1) / v * 3 * params / bw
    rounds, compute = (m / v, m / v * 3 * (f + b)) if replicas == "round-robin" else (m, m * 3 * (f + b) / v)
    assert simulate(p).iteration_s == pytest.approx(max(compute, rounds * allreduce))
