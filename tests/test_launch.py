"""The launcher (runtime/launch.py): results by rank, the root failure named and every worker
ended, a hang ended after its limit, typed messages, and joining torchrun's group."""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from pipeplan.errors import PipeplanError
from pipeplan.runtime import launch as launch_mod
from pipeplan.runtime.launch import (Done, Failed, Failure, LaunchFailed, Progress, Worker, joined_from_env, launch,
                                     torchrun_world, watch)

from helpers import process_alive


def _words(failure: Failure) -> str:
    return failure.words("test", f"rank {failure.rank}")


def summed(ctx: Worker, base: int) -> tuple[int, int, float]:
    """Each rank's (rank, world, sum over the group of base + rank)."""
    t = torch.tensor([float(base + ctx.rank)])
    dist.all_reduce(t)
    return ctx.rank, ctx.world, float(t)


def rank1_raises(ctx: Worker) -> None:
    if ctx.rank == 1:
        raise ValueError("boom\nsecond line")
    dist.barrier()  # rank 0 waits for rank 1, whose connection then drops


def rank1_hangs(ctx: Worker) -> None:
    if ctx.rank == 1:
        ctx.progress("stuck here")
        time.sleep(3600)
    time.sleep(0.5)
    ctx.progress("waiting for rank 1")
    dist.barrier()


def fork_server_for_runs() -> None:
    """Start this process's fork server (every launch forks its workers there) unless it
    runs, as the executor's launch would. It preloads only the worker module of the launch
    that starts it: one started for another module (this file's, calibration's, DTensor's)
    leaves every later plan run's workers to import torch's pipelining and dynamo themselves,
    seconds each. (The tests of launching files whose first launch is not the executor's call
    this first.)"""
    from pipeplan.runtime import executor

    launch_mod._context(executor._worker)


@pytest.fixture(autouse=True)
def fork_server(request) -> None:
    """The fork server started as the executor's runs need it, before this file's launches."""
    if request.node.get_closest_marker("slow"):  # the tests that spawn workers
        fork_server_for_runs()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The rendezvous directory goes to ``tmp_path`` (to see that it is removed)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _no_leftovers(before: set[int], tmp_path) -> None:
    new = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not [p for p in new if process_alive(p.pid)]
    assert not list(tmp_path.glob("pipeplan-rendezvous-*"))


@pytest.mark.slow
def test_results_come_back_by_rank(private_tmp):
    assert launch(summed, 2, (10,), diagnose=_words, threads=1) == {0: (0, 2, 21.0), 1: (1, 2, 21.0)}
    _no_leftovers(set(), private_tmp)


@pytest.mark.slow
def test_a_worker_that_raises_is_the_root_failure_and_every_worker_ends(private_tmp):
    """Rank 0's knock-on error (its peer's connection closed) is not the one named."""
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(PipeplanError) as e:
        launch(rank1_raises, 2, diagnose=_words, timeout_s=300)
    assert str(e.value) == "test failed: rank 1 raised ValueError: boom second line"
    _no_leftovers(before, private_tmp)


@pytest.mark.slow
def test_a_hang_is_ended_after_its_limit(private_tmp):
    """No rank progressed for hang_s: the run ends, naming the rank that stopped first."""
    before = {p.pid for p in multiprocessing.active_children()}
    start = time.monotonic()
    with pytest.raises(PipeplanError, match=r"test failed: rank 1 made no progress for \d+ s "
                                            r"\(last: stuck here\); the other ranks wait for it"):
        launch(rank1_hangs, 2, diagnose=_words, hang_s=1.0, timeout_s=300)
    assert time.monotonic() - start < 120
    _no_leftovers(before, private_tmp)


class _Ended:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


def test_messages_are_typed_and_frozen():
    msg = Done(1, {"x": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.rank = 2
    assert (Progress(0, "a", 1.0).label, Failed(3, "E: x").text) == ("a", "E: x")


def test_a_silent_death_and_a_timeout_are_failures_of_their_kind():
    results = queue.Queue()
    results.put(Done(0, "ok"))
    with pytest.raises(LaunchFailed) as e:
        watch([_Ended(0), _Ended(-9)], results)
    assert (e.value.failure.kind, e.value.failure.rank, e.value.failure.exitcode) == ("died", 1, -9)
    assert _words(e.value.failure) == "test failed: rank 1 died with exit code -9"
    results.put(Done(1, "ok"))
    with pytest.raises(LaunchFailed) as e:
        watch([_Ended(None), _Ended(None)], results, timeout_s=0.2)
    assert (e.value.failure.kind, e.value.failure.pending) == ("timed out", (0,))
    assert _words(e.value.failure) == "test failed: not finished within 0.2 s"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_env(monkeypatch):
    """The environment torchrun gives the only process of a world of 1 (loopback)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    if dist.is_initialized():
        dist.destroy_process_group()


def test_without_torchrun_nothing_is_joined(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert torchrun_world() is None and joined_from_env() is None and not dist.is_initialized()


def test_joined_from_env_joins_torchruns_group(torchrun_env):
    assert joined_from_env() == (0, 1)
    assert dist.is_initialized() and dist.get_world_size() == 1


def test_launch_under_torchrun_joins_instead_of_spawning(torchrun_env):
    before = {p.pid for p in multiprocessing.active_children()}
    assert launch(summed, 1, (5,), diagnose=_words, join=True) == {0: (0, 1, 5.0)}
    assert {p.pid for p in multiprocessing.active_children()} == before and not dist.is_initialized()
    with pytest.raises(PipeplanError, match="torchrun started 1 processes; this run needs 2"):
        launch(summed, 2, (5,), diagnose=_words, join=True)


def test_a_plan_runs_as_torchruns_process(torchrun_env):
    """``run_plan`` under torchrun: this process is the plan's one device."""
    from pipeplan.runtime.executor import RunConfig, run_plan
    from test_runtime import plan_for

    out = run_plan(plan_for("1f1b", "split", None, 1), RunConfig("example:mlp", steps=1))
    assert out.processes == 1 and out.measured_s > 0 and sorted(out.params) == [0]
    assert not dist.is_initialized()


_CTRL_C_AT_REGISTER = '''
import os, signal
from multiprocessing import resource_tracker
from pipeplan.runtime.launch import launch

signal.signal(signal.SIGINT, signal.default_int_handler)  # as the CLI does: a shell's background job inherits it ignored
registered = resource_tracker.register

def register(name, rtype):  # a Ctrl-C just after the queue registers a semaphore
    registered(name, rtype)
    os.kill(os.getpid(), signal.SIGINT)

resource_tracker.register = register
try:
    launch(print, 1, diagnose=str)
except KeyboardInterrupt:
    print("interrupted")
'''


@pytest.mark.slow
def test_ctrl_c_while_the_results_queue_is_made_leaves_no_semaphore_behind():
    """A Ctrl-C between multiprocessing registering a semaphore of the results queue and
    arranging its removal at exit: the resource tracker warned, at exit, of a leaked semaphore
    (a second line after the launcher's one, seen in CI). It is held until the queue is made,
    then delivered."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _CTRL_C_AT_REGISTER], capture_output=True, text=True, env=env,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "interrupted\n", ""), done
