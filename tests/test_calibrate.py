"""Calibration: 2 local CPU workers over gloo; YAML round trip; worker failures leave no orphans."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeplan.cluster import hierarchical, load_cluster
from pipeplan.cluster.model import Cluster, Device
from pipeplan.errors import PipeplanError
from pipeplan.runtime.calibrate import calibrate, cluster_to_yaml

from test_launch import fork_server_for_runs

pytestmark = pytest.mark.slow  # worker processes: seconds each


def _workers() -> set[int]:
    """Live (non-zombie) spawned worker processes of this process, from /proc: its descendants
    but multiprocessing's own helpers among its children, the resource tracker and the fork
    server (which lives as long as this process; the workers are its children)."""
    me, parent, live, helpers = os.getpid(), {}, set(), set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        pid, ppid = int(proc.name), int(fields[1])
        parent[pid] = ppid
        if fields[0] != "Z":
            live.add(pid)
        if ppid == me and (b"resource_tracker" in cmdline or b"multiprocessing.forkserver" in cmdline):
            helpers.add(pid)
    tree, new = set(), {me}
    while new:
        new = {p for p, pp in parent.items() if pp in new} - tree
        tree |= new
    return (tree - helpers) & live


@pytest.fixture(scope="module", autouse=True)
def fork_server() -> None:
    """This process's fork server, started as the executor's runs need it before a
    calibration starts it for its own workers (``test_launch.fork_server_for_runs``)."""
    fork_server_for_runs()


@pytest.fixture(scope="module")
def calibrated() -> tuple[Cluster, dict]:
    return calibrate(workers=2, seconds=0.1)


def test_two_cpu_workers(calibrated):
    cluster, m = calibrated
    assert cluster.names == ["worker0", "worker1"] and len(cluster) == 2
    assert all(d.kind == "CPU" and d.server == "localhost" and d.memory > 0 for d in cluster.devices)
    assert (cluster.speed > 0).all() and np.isfinite(cluster.speed).all()
    off = ~np.eye(2, dtype=bool)
    assert (cluster.bandwidth[off] > 0).all() and np.isfinite(cluster.bandwidth[off]).all()
    assert (cluster.latency[off] > 0).all() and np.isfinite(cluster.latency[off]).all()
    assert m["workers"] == 2 and m["threads"] == m["profile_threads"] == 1
    assert m["speed"] == list(cluster.speed)
    # same threads as the profile: a worker alone is the profiling process (speed 1); with
    # the others busy it is slower by its own measured ratio
    assert m["solo_speed"] == [1.0, 1.0]
    assert all(0 < s <= 1.0 for s in m["speed"])
    (link,) = m["links"]
    assert link["pair"] == [0, 1] and link["small_bytes"] == 4 and link["large_bytes"] >= 2**24
    assert cluster.latency[0, 1] == link["latency_s"] and cluster.bandwidth[0, 1] == link["bandwidth_Bps"]


def test_yaml_round_trip(calibrated, tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text(cluster_to_yaml(calibrated[0]))
    assert load_cluster(str(path)) == calibrated[0]


def test_yaml_round_trip_asymmetric(tmp_path):
    devs = [Device("a", kind="CPU", memory=1e9, speed=0.7), Device("b", kind="V100", speed=1 / 3, server="s"),
            Device("c", kind="GPU", memory=3.5e9, speed=2.0)]
    bw = np.array([[0, 1e9 / 3, 2e9], [5e8, 0, 7e9], [2e9, 7e9, 0]])
    lat = np.array([[0, 1e-5, 2e-6], [3e-5, 0, 0.0], [2e-6, 0.0, 0]])
    cluster = Cluster("odd", devs, bw, lat)
    path = tmp_path / "odd.yml"
    path.write_text(cluster_to_yaml(cluster))
    assert load_cluster(str(path)) == cluster
    path.write_text(cluster_to_yaml(hierarchical("h", 2, 2, 1e10, 1e9, latency=1e-6)))
    assert load_cluster(str(path)) == hierarchical("h", 2, 2, 1e10, 1e9, latency=1e-6)


@pytest.mark.parametrize("factory, message", [("fails_at_build", "rank 1 failed: .*injected failure"),
                                              ("exits_at_build", "rank 1 died \\(exit code 3\\)")])
def test_worker_failure_names_rank_and_leaves_no_orphans(factory, message):
    before = _workers()
    with pytest.raises(PipeplanError, match=message):
        calibrate(workers=2, seconds=0.1, model_spec=f"failing_models:{factory}")
    assert _workers() <= before


class _FakeProcess:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


def test_the_root_failure_is_named_when_a_peers_error_arrives_first():
    """Rank 1 fails; rank 0's report that the connection to it dropped arrives first: the
    failure named is rank 1's own (the launcher's watch, in calibration's words)."""
    import queue

    from pipeplan.runtime.calibrate import _diagnose
    from pipeplan.runtime.launch import Failed, LaunchFailed, watch

    results = queue.Queue()
    results.put(Failed(0, "RuntimeError: Connection closed by peer [127.0.0.1]:4242"))
    results.put(Failed(1, "RuntimeError: injected failure at failing_models.py:50"))
    with pytest.raises(LaunchFailed) as e:
        watch([_FakeProcess(0), _FakeProcess(0)], results)
    assert _diagnose(e.value.failure) == ("calibration worker rank 1 failed: RuntimeError: injected failure "
                                          "at failing_models.py:50")


def test_bad_arguments():
    with pytest.raises(PipeplanError, match="workers >= 1"):
        calibrate(workers=0)
    with pytest.raises(PipeplanError, match="device"):
        calibrate(device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_absent():
    with pytest.raises(PipeplanError, match="no CUDA device"):
        calibrate(device="cuda")
