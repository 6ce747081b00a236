"""Multi-resource devices, mobile presets and the fb-parallel schedule."""

import numpy as np
import pytest

from pipeplan.cluster import Cluster, Device, load_cluster
from pipeplan.cluster.model import Resource
from pipeplan.errors import PipeplanError
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate

from helpers import chain_plan, uniform_chain


def test_mobile_presets():
    c = load_cluster("mobile-4")
    assert len(c) == 4 and all(len(d.resources) == 2 for d in c.devices)
    assert {r.name for r in c.devices[0].resources} == {"cpu", "gpu"}
    assert c.bandwidth[0, 1] == pytest.approx(1e9 / 8)
    h = load_cluster("mobile-hetero-12")
    assert len(h) == 12 and h == load_cluster("mobile-hetero-12")
    assert {d.kind for d in h.devices} <= {"laptop-i7-gtx1650", "laptop-i5-irisxe", "rpi4b"}
    with pytest.raises(PipeplanError, match="unknown cluster preset"):
        load_cluster("mobile-hetero-x")


def test_yaml_resources(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("devices:\n  - {name: a, resources: [{name: cpu, fwd_speed: 0.1, bwd_speed: 0.05},"
                 " {name: gpu, fwd_speed: 0.3, bwd_speed: 0.3}]}\n  - {name: b, kind: rpi4b}\nbandwidth: 1Gbps\n")
    c = load_cluster(str(f))
    assert c.fspeed[0] == pytest.approx(0.4) and c.bspeed[0] == pytest.approx(0.35)
    assert c.devices[1].resources[0].name == "cpu"
    f.write_text("devices:\n  - {name: a, resources: [{name: cpu, fwd_speed: x}]}\nbandwidth: 1Gbps\n")
    with pytest.raises(PipeplanError, match="resources"):
        load_cluster(str(f))


def one_resource_cluster(v: int) -> Cluster:
    return Cluster("c", [Device(f"d{i}") for i in range(v)], np.full((v, v), 1e12), np.zeros((v, v)))


@pytest.mark.parametrize("beta", [0.2, 1 / 3, 0.5, 0.8])
def test_fb_parallel_time_shared_single_resource(beta):
    """One resource time-shared: a stage needs max(f / beta, b / (1 - beta)) per microbatch."""
    s_count, m, f, b = 3, 6, 0.1, 0.2
    g = uniform_chain(s_count, f, b)
    p = chain_plan(g, one_resource_cluster(s_count), list(range(s_count + 1)), [1] * s_count, m, "fb-parallel")
    p.allocation = [{"*": beta}] * s_count
    r = simulate(p)
    assert r.iteration_s == pytest.approx(m * max(f / beta, b / (1 - beta)))
    tl = r.timeline
    assert tl.resources[:2] == ["d0/fwd", "d0/bwd"]
    for res in range(len(tl.resources)):
        idx = tl.tasks_on(res)
        assert np.all(tl.start[idx][1:] >= tl.end[idx][:-1] - 1e-12)


def test_fb_parallel_uses_two_resources_at_once():
    """A CPU better at forward and a GPU: the right split beats running the passes in turn."""
    dev = Device("laptop", resources=(Resource("cpu", 0.2, 0.05), Resource("gpu", 0.5, 0.5)))
    c = Cluster("c", [dev], np.zeros((1, 1)), np.zeros((1, 1)))
    g = uniform_chain(1, 1.0, 2.0)
    seq = simulate(Plan(g, c, [Stage(g.ids, ["laptop"])], 8, schedule="async-1f1b"))
    assert seq.iteration_s == pytest.approx(8 * (1 / 0.7 + 2 / 0.55))
    # forward on all of the CPU and 1/15 of the GPU balances F = G = 1 / (0.2 + 0.5/15)
    par = Plan(g, c, [Stage(g.ids, ["laptop"])], 8, schedule="fb-parallel", allocation=[{"cpu": 1.0, "gpu": 1 / 15}])
    t = simulate(par).iteration_s
    assert t == pytest.approx(8 / (0.2 + 0.5 / 15))
    assert t < seq.iteration_s
