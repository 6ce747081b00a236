import json

import numpy as np
import pytest

from pipeplan.cluster import PRESETS, cluster_from_full_dict, cluster_to_dict, load_cluster
from pipeplan.errors import PipeplanError

Gbps = 1e9 / 8


def test_every_preset_loads():
    sizes = {"v100x4": 4, "1080ti-4x2": 8, "spp-sim": 32, "automap-a": 16, "automap-b": 24,
             "automap-c": 32, "drlpp-4gpu": 4}
    assert set(sizes) <= set(PRESETS)
    for name, v in sizes.items():
        c = load_cluster(name)
        assert len(c) == v
        off = ~np.eye(v, dtype=bool)
        assert np.all(c.bandwidth[off] > 0)


def test_spp_sim_ranges_and_determinism():
    c = load_cluster("spp-sim")
    assert c == load_cluster("spp-sim")
    bw = c.bandwidth / Gbps
    server = np.repeat(np.arange(8), 4)
    for a in range(32):
        for b in range(32):
            if a == b:
                continue
            if server[a] != server[b]:
                assert 32 <= bw[a, b] <= 40
            elif server[a] < 3:
                assert 96 <= bw[a, b] <= 128
            else:
                assert 160 <= bw[a, b] <= 200
    assert np.allclose(c.bandwidth, c.bandwidth.T)


def test_hier_spec():
    c = load_cluster("hier:servers=4,gpus=2,intra=128Gbps,inter=50Gbps,kind=1080Ti,latency=5us")
    assert len(c) == 8 and c.devices[0].kind == "1080Ti"
    assert c.bandwidth[0, 1] == pytest.approx(16e9) and c.bandwidth[0, 2] == pytest.approx(50 * Gbps)
    assert c.latency[0, 1] == pytest.approx(5e-6)
    assert load_cluster("hier:servers=1,gpus=2,intra=10GB/s").latency[0, 1] == 0


@pytest.mark.parametrize("spec,fragment", [
    ("hier:servers=2,gpus=2,intra=1Gbps", "missing inter"),
    ("hier:servers=2,gpus=x,intra=1Gbps,inter=1Gbps", "integers"),
    ("hier:servers=1,gpus=2,intra=fast", "bandwidth"),
    ("hier:servers=2,gpus=2,intra=0Gbps,inter=10Gbps", "intra=0Gbps is no link"),
    ("hier:servers=2,gpus=1,intra=1Gbps,inter=0", "inter=0 is no link"),
    ("hier:servers=1,gpus=2,intra=1Gbps,colour=red", "unknown key"),
    ("hier:servers=1,gpus=2,intra=1Gbps,kind=Z80", "unknown device kind"),
    ("no-such-preset", "unknown cluster preset"),
    ("missing.yaml", "not found"),
])
def test_bad_cluster_specs(spec, fragment):
    with pytest.raises(PipeplanError, match=fragment):
        load_cluster(spec)


def test_yaml_file(tmp_path):
    f = tmp_path / "lab.yaml"
    f.write_text("""
name: lab
servers:
  - {name: a, gpus: 2, kind: V100, intra: 128Gbps}
devices:
  - {name: slow, kind: 1080Ti, memory: 8GiB, speed: 0.5, server: b}
inter: 10Gbps
latency: 2us
links:
  - {from: ag0, to: slow, bandwidth: 1Gbps}
""")
    c = load_cluster(str(f))
    assert c.names == ["ag0", "ag1", "slow"]
    assert c.bandwidth[0, 1] == pytest.approx(16e9)
    assert c.bandwidth[1, 2] == pytest.approx(10 * Gbps)
    assert c.bandwidth[0, 2] == pytest.approx(1 * Gbps) == c.bandwidth[2, 0]
    assert c.devices[2].memory == 8 * 2**30 and c.devices[2].speed == 0.5
    assert c.latency[0, 2] == pytest.approx(2e-6)


@pytest.mark.parametrize("body,fragment", [
    ("devices: [{name: a}, {name: a}]\nbandwidth: 1Gbps", "appears twice"),
    ("devices: [{name: a}, {name: b}]", "no bandwidth"),
    ("devices: [{name: a, speed: 0}]", "speed"),
    ("devices: [{name: a, colour: 1}]", "unknown key"),
    ("devices: [{name: a}, {name: b}]\nbandwidth: 1Gbps\nlinks: [{from: a, to: z}]", "unknown device"),
    ("devices: [a, b", "not valid YAML"),
])
def test_bad_yaml(tmp_path, body, fragment):
    f = tmp_path / "c.yaml"
    f.write_text(body)
    with pytest.raises(PipeplanError, match=fragment):
        load_cluster(str(f))


def test_calibrated_keys_round_trip(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("devices: [{name: a, solo_speed: 1.0, speed: 0.8}, {name: b}]\nbandwidth: 1Gbps\n"
                 "allreduce_efficiency: 0.4\naction_overhead_s: 0.5ms\nupdate_s_per_byte: 2.5e-10\n")
    c = load_cluster(str(f))
    assert c.meta == {"allreduce_efficiency": 0.4, "action_overhead_s": pytest.approx(5e-4),
                      "update_s_per_byte": 2.5e-10}
    assert cluster_from_full_dict(cluster_to_dict(c)).meta == c.meta
    assert c.devices[0].solo_speed == 1.0 and c.devices[0].speed == 0.8
    f.write_text("devices: [{name: a}]\nallreduce_efficiency: 2\n")
    with pytest.raises(PipeplanError, match="allreduce_efficiency"):
        load_cluster(str(f))


@pytest.mark.parametrize("spec,compact", [("hier:servers=6,gpus=4,intra=300GB/s,inter=25Gbps", True),
                                          ("spp-sim", False), ("v100x4", True)])
def test_plan_form_of_links_round_trips_exactly(spec, compact):
    """Links uniform between every pair of servers are stored per pair of servers (large
    clusters stay small in a plan file); others as full matrices; both read back exactly."""
    c = load_cluster(spec)
    d = cluster_to_dict(c)
    assert ("server_links" in d) == compact
    back = cluster_from_full_dict(json.loads(json.dumps(d)))
    assert np.array_equal(back.bandwidth, c.bandwidth) and np.array_equal(back.latency, c.latency)
