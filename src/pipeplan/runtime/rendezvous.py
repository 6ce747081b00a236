"""Where the worker processes of one local run meet: a torch.distributed store in a file of
a private directory (no listening socket; other users cannot reach it), and gloo's and
NCCL's connections bound to the loopback interface. ``run``, ``shard --run`` and
``calibrate`` start their workers on one machine, so nothing of theirs listens outside
127.0.0.0/8."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist


@contextlib.contextmanager
def local_rendezvous() -> Iterator[str]:
    """The launcher's side: the ``init_method`` its workers join (a store file in a fresh
    directory only this user can enter), removed with the directory when the run ends."""
    folder = tempfile.mkdtemp(prefix="pipeplan-rendezvous-")
    try:
        yield "file://" + os.path.join(folder, "store")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def loopback_interface() -> str:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n.startswith("lo")), "lo")


def join_local_group(backend: str, init_method: str, rank: int, world: int,
                     timeout: timedelta | None = None) -> None:
    """A worker's side: gloo (and NCCL) bind their sockets on loopback, then the process
    joins the default group through the launcher's store file."""
    interface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = interface
    extra = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, **extra)
