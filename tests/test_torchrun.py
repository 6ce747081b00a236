"""A plan run under torchrun on two "nodes" of this machine (127.0.0.1), two processes each:
``torchrun ... -m pipeplan.runtime.launch PLAN --model SPEC --check``; every rank trains its
part and the result (rank 0 checks it) equals one-process training."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_runtime import plan_for

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not beside this Python")
def test_two_nodes_of_two_processes_train_the_plan_as_one_process_does(tmp_path):
    plan = tmp_path / "plan.json"
    plan_for("1f1b", "round-robin", 2, 4, spec="example:tiny").save(plan)  # 4 layers: the processes are the cost
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    nodes = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(r),
                               "--master-addr", "127.0.0.1", "--master-port", port, "-m", "pipeplan.runtime.launch",
                               str(plan), "--model", "example:tiny", "--steps", "2", "--check"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
             for r in (0, 1)]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    for r, (node, out) in enumerate(zip(nodes, outs)):
        assert node.returncode == 0, out[-2000:]
        # each rank's line, wherever its newline went: torchrun runs python -u, whose print writes
        # the text and its newline apart, so the node's two ranks may interleave them
        said = re.findall(r"rank (\d+): [^\n]*?measured timeline of ([^,\n]*),", out)
        ranks = sorted(int(rank) for rank, _ in said)
        assert ranks == [2 * r, 2 * r + 1], out[-2000:]
        assert out.count("4 processes") == 2 and out.count("check pass") == (1 if r == 0 else 0)
        assert out.count("checked on rank 0") == (1 if r == 0 else 2)
        # every rank holds the measured median step of all four processes: on each, the forward
        # and backward of its pipeline's 2 microbatches, the all-reduce and the optimizer step
        timelines = {timeline for _, timeline in said}
        assert len(timelines) == 1
        count, rest = timelines.pop().split(" actions ")
        assert rest == "on 4 devices" and int(count) >= 4 * 6


def test_the_entry_point_outside_torchrun_is_one_line(tmp_path, capsys, monkeypatch):
    from pipeplan.runtime.launch import main

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    plan = tmp_path / "plan.json"
    plan_for("1f1b", "round-robin", 2, 4).save(plan)
    assert main([str(plan), "--model", "example:mlp"]) == 2
    err = capsys.readouterr().err.strip()
    assert "runs under torchrun" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, words", [(["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
                                         (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
                                         (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
                                         ([], "the following arguments are required: --model")])
def test_bad_launcher_arguments_are_one_line(tmp_path, capsys, argv, words):
    from pipeplan.runtime.launch import main

    plan = tmp_path / "plan.json"
    plan_for("1f1b", "round-robin", 2, 4).save(plan)
    model = [] if not argv else ["--model", "example:mlp"]
    with pytest.raises(SystemExit) as exit_:
        main([str(plan), *model, *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and words in err


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) of sockets listening on ``port``."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                out.add(addr)
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_torchruns_store_binding_is_the_documented_exception(capsys):
    """No pipeplan command listens beyond loopback; torchrun's own store does, with any
    --master-addr: torch's TCPStore binds the wildcard address. That exception is said in
    docs/runtime.md and in the launcher's --help; if torch ever binds the address given, this
    test says the note is stale."""
    import torch.distributed as dist

    from pipeplan.runtime.launch import main

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    wildcard = {"00000000", "00000000000000000000000000000000"}
    assert _listening_addresses(store.port) & wildcard, "torch now binds the address given: update the docs"
    del store
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "listens on every interface at --master-port" in " ".join(capsys.readouterr().out.split())
    assert "listens on every interface" in " ".join((Path(__file__).parents[1] / "docs" / "runtime.md").read_text().split())
