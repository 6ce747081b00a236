"""``run``, ``shard --run`` and ``calibrate`` listen on loopback only: every listening TCP
socket of the command's process tree, read from /proc (its file descriptors matched with
/proc/net/tcp and tcp6) once all its workers joined their process group. The workers hang
(``failing_models:hangs``) so that the group stays up however loaded the machine is."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.models import load_model

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


def listeners_once_joined(argv: list[str], processes: int, tmp_path: Path, limit_s: float = 300) -> list[str]:
    """Start ``pipeplan ARGV``; once ``processes`` processes of its tree hold a listening socket
    (every worker joined), return all the tree's listening addresses, then end the command."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pipeplan", *argv], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, cwd=tmp_path)
    try:
        deadline = time.time() + limit_s
        while time.time() < deadline and proc.poll() is None:
            listening = _listening()
            held = {pid: [listening[i] for i in _socket_inodes(pid) if i in listening]
                    for pid in _process_tree(proc.pid)}
            if sum(1 for addrs in held.values() if addrs) >= processes:
                return sorted(a for addrs in held.values() for a in addrs)
            time.sleep(0.1)
        raise AssertionError(f"the workers never all listened (exit code {proc.poll()}): "
                             f"{(tmp_path / 'stderr').read_text()[-2000:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _hanging_plan(path: Path) -> None:
    model, _ = load_model("failing_models:hangs")
    names = [n for n, _ in model.named_children()]
    n = len(names)
    g = Graph(name="m", ids=names, fwd=[1e-3] * n, bwd=[2e-3] * n, params=[0.0] * n, act=[1e4] * n,
              flops=[float("nan")] * n, desc=[""] * n, edges=[(i, i + 1) for i in range(n - 1)], meta={})
    c = hierarchical("local", 1, WORKERS, 1e9, 1e9)
    Plan(g, c, [Stage(names[:n // 2], c.names[:1]), Stage(names[n // 2:], c.names[1:])], 4,
         schedule="1f1b").save(path)


def test_run_listens_on_loopback_only(tmp_path):
    _hanging_plan(tmp_path / "plan.json")
    got = listeners_once_joined(["run", "plan.json", "--model", "failing_models:hangs", "--timeout", "600",
                                 "--hang-timeout", "600"], WORKERS, tmp_path)
    assert all(_is_loopback(a) for a in got), got


def test_shard_run_listens_on_loopback_only(tmp_path):
    got = listeners_once_joined(["shard", "--model", "failing_models:hangs", "--devices", str(WORKERS),
                                 "--cluster", "automap-c", "--method", "milp", "--run", "--steps", "50"],
                                WORKERS, tmp_path)
    assert all(_is_loopback(a) for a in got), got


def test_calibrate_listens_on_loopback_only(tmp_path):
    got = listeners_once_joined(["calibrate", "--workers", str(WORKERS), "--seconds", "0.2", "--no-runtime",
                                 "--model", "failing_models:hangs"], WORKERS, tmp_path)
    assert all(_is_loopback(a) for a in got), got


@pytest.mark.parametrize("text,loopback", [("0100007F", True), ("0101007F", True), ("00000000", False),
                                           ("0100A8C0", False),
                                           ("00000000000000000000000001000000", True),
                                           ("00000000000000000000000000000000", False),
                                           ("0000000000000000FFFF00000100007F", True)])
def test_proc_addresses_are_read_as_the_kernel_writes_them(text, loopback):
    assert _is_loopback(f"{_address(text)}:1") == loopback
