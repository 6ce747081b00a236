"""The launchers' processes, seen from outside through /proc. ``run``, ``shard --run`` and
``calibrate`` listen on loopback only: every listening TCP socket of the command's process
tree (its file descriptors matched with /proc/net/tcp and tcp6) once all its workers joined
their process group. Signals end a run with one line and every worker process. The workers
hang (``failing_models``) so that each phase lasts however loaded the machine is."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.models import load_model

from helpers import default_sigint, process_alive

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")]

TESTS = Path(__file__).resolve().parent
WORKERS = 2
LISTEN = "0A"


def _process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:  # the process ended meanwhile
        pass
    return out


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp* print an address as 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def _listening() -> dict[str, str]:
    """inode -> "address:port" of every listening TCP socket of this network namespace."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN:
                    addr, port = fields[1].split(":")
                    out[fields[9]] = f"{_address(addr)}:{int(port, 16)}"
    return out


def _is_loopback(where: str) -> bool:
    addr = ipaddress.ip_address(where.rsplit(":", 1)[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def _start(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    """``pipeplan ARGV`` in its own session (a terminal's Ctrl-C reaches its process group),
    stderr to ``tmp_path/stderr``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)]),
           "TMPDIR": str(tmp_path)}
    with open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen([sys.executable, "-m", "pipeplan", *argv], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, cwd=tmp_path, start_new_session=True,
                                preexec_fn=default_sigint)


def _wait_until(proc: subprocess.Popen, tmp_path: Path, what: str, condition, limit_s: float = 300):
    """Poll ``condition()`` until it returns something true (returned), while ``proc`` runs
    (every 0.2 s: a condition reads all of /proc, which costs the machine CPU time)."""
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None:
        got = condition()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened (exit code {proc.poll()}): "
                         f"{(tmp_path / 'stderr').read_text()[-2000:]}")


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _joined(root: int, processes: int) -> list[str] | None:
    """The listening addresses of ``root``'s tree once ``processes`` of its processes hold
    one (every worker joined its group); None before."""
    listening = _listening()
    held = {pid: [listening[i] for i in _socket_inodes(pid) if i in listening] for pid in _process_tree(root)}
    if sum(1 for addrs in held.values() if addrs) < processes:
        return None
    return sorted(a for addrs in held.values() for a in addrs)


def listeners_once_joined(argv: list[str], processes: int, tmp_path: Path) -> list[str]:
    """Start ``pipeplan ARGV``; once every worker joined, all its tree's listening addresses."""
    proc = _start(argv, tmp_path)
    try:
        return _wait_until(proc, tmp_path, "all workers listening", lambda: _joined(proc.pid, processes))
    finally:
        _end(proc)


def _hanging_plan(path: Path) -> None:
    model, _ = load_model("failing_models:hangs")
    names = [n for n, _ in model.named_children()]
    n = len(names)
    g = Graph(name="m", ids=names, fwd=[1e-3] * n, bwd=[2e-3] * n, params=[0.0] * n, act=[1e4] * n,
              flops=[float("nan")] * n, desc=[""] * n, edges=[(i, i + 1) for i in range(n - 1)], meta={})
    c = hierarchical("local", 1, WORKERS, 1e9, 1e9)
    Plan(g, c, [Stage(names[:n // 2], c.names[:1]), Stage(names[n // 2:], c.names[1:])], 4,
         schedule="1f1b").save(path)


def test_shard_run_listens_on_loopback_only(tmp_path):
    got = listeners_once_joined(["shard", "--model", "failing_models:hangs", "--devices", str(WORKERS),
                                 "--cluster", "automap-c", "--method", "milp", "--run", "--steps", "50"],
                                WORKERS, tmp_path)
    assert all(_is_loopback(a) for a in got), got


def test_calibrate_listens_on_loopback_only(tmp_path):
    got = listeners_once_joined(["calibrate", "--workers", str(WORKERS), "--seconds", "0.05", "--no-runtime",
                                 "--model", "failing_models:hangs"], WORKERS, tmp_path)
    assert all(_is_loopback(a) for a in got), got


@pytest.mark.parametrize("text,loopback", [("0100007F", True), ("0101007F", True), ("00000000", False),
                                           ("0100A8C0", False),
                                           ("00000000000000000000000001000000", True),
                                           ("00000000000000000000000000000000", False),
                                           ("0000000000000000FFFF00000100007F", True)])
def test_proc_addresses_are_read_as_the_kernel_writes_them(text, loopback):
    assert _is_loopback(f"{_address(text)}:1") == loopback


def _workers(root: int) -> set[int]:
    """The worker processes in ``root``'s tree, by the name the launcher gives them
    (``pipeplan-wRANK``; not multiprocessing's fork server or resource tracker)."""
    out = set()
    for pid in _process_tree(root) - {root}:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith("pipeplan-w"):
                    out.add(pid)
        except OSError:
            pass
    return out


def _run(tmp_path: Path, factory: str) -> subprocess.Popen:
    _hanging_plan(tmp_path / "plan.json")
    return _start(["run", "plan.json", "--model", f"failing_models:{factory}", "--steps", "1", "--check",
                   "--timeout", "600", "--hang-timeout", "600"], tmp_path)


def _signalled(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` as a terminal sends Ctrl-C (to the whole process group) or as ``kill`` does."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    proc.wait(120)


@dataclass
class JoinedRun:
    """A ``run`` of the hanging plan (``_run``) once every worker joined its group: the
    listening addresses of its process tree and its workers then."""

    proc: subprocess.Popen
    tmp_path: Path
    listening: list[str]
    workers: set[int]


def _joined_run(tmp_path: Path) -> JoinedRun:
    proc = _run(tmp_path, "hangs")
    try:
        listening = _wait_until(proc, tmp_path, "all workers joined", lambda: _joined(proc.pid, WORKERS))
        return JoinedRun(proc, tmp_path, listening, _workers(proc.pid))
    except BaseException:
        _end(proc)
        raise


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> Iterator[JoinedRun]:
    """One run for two tests (a command's run costs seconds of CPU): the loopback test reads
    its listeners, the Ctrl-C case of the signal test ends it."""
    run = _joined_run(tmp_path_factory.mktemp("shared-run"))
    try:
        yield run
    finally:
        _end(run.proc)


def test_run_listens_on_loopback_only(shared_run):
    assert all(_is_loopback(a) for a in shared_run.listening), shared_run.listening


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_a_signal_while_the_workers_train_ends_every_worker(sig, code, tmp_path, request):
    """Ctrl-C exits 130 and SIGTERM 143, each with one line; a parent killed with SIGKILL
    takes its workers with it (PR_SET_PDEATHSIG). (Ctrl-C ends the run the loopback test read.)"""
    run = request.getfixturevalue("shared_run") if sig == signal.SIGINT else _joined_run(tmp_path)
    proc, tmp_path, workers = run.proc, run.tmp_path, run.workers
    try:
        _signalled(proc, sig)
    finally:
        _end(proc)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == code, err
    if sig != signal.SIGKILL:
        said = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
        assert err.count("\n") == 1 and f"pipeplan: run interrupted ({said})" in err, err
        assert not list(tmp_path.glob("pipeplan-rendezvous-*")), "the rendezvous directory was left behind"
    deadline = time.time() + 120
    while time.time() < deadline and any(process_alive(p) for p in workers):
        time.sleep(0.2)
    assert len(workers) == WORKERS and not [p for p in workers if process_alive(p)]


def test_sigterm_after_the_workers_finished_says_so(tmp_path):
    """SIGTERM during the check's one-process training (the workers are gone): one line, 143."""
    proc = _run(tmp_path, "hangs_in_check")
    try:
        workers = _wait_until(proc, tmp_path, "the workers started",
                              lambda: w if len(w := _workers(proc.pid)) >= WORKERS else None)
        _wait_until(proc, tmp_path, "the workers finished", lambda: not any(process_alive(p) for p in workers))
        _signalled(proc, signal.SIGTERM)
    finally:
        _end(proc)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 143 and err.count("\n") == 1 and "pipeplan: run interrupted (SIGTERM)" in err, err
    assert not list(tmp_path.glob("pipeplan-rendezvous-*")), "the rendezvous directory was left behind"
