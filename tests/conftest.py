"""Shared fixtures: the real PipeDream profiles live in ../shared (never copied here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
SHARED = Path(__file__).resolve().parents[2] / "shared"
PROFILES = SHARED / "profiles" / "pipedream"
# (model, nodes, edges) from ../shared/profiles/README.md
PROFILE_TABLE = [("alexnet", 23, 23), ("vgg16", 41, 41), ("resnet50", 177, 193),
                 ("resnext101", 347, 380), ("inception_v3", 326, 362), ("gnmt", 48, 58)]


def profile_path(name: str) -> Path:
    path = PROFILES / name / "graph.txt"
    if not path.is_file():
        pytest.skip(f"shared profile {path} is absent (the profiles live in ../shared beside the repo)")
    return path


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: on a shared 2-core machine torch's intra-op threads only contend."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# pytest rewrites each test module's asserts and caches the result beside it, unless the
# environment says not to write bytecode (PYTHONDONTWRITEBYTECODE); then every worker of every
# run would rewrite all of them again (seconds). The caches are __pycache__ folders git ignores.
sys.dont_write_bytecode = False


def pytest_configure(config) -> None:
    """Byte-compile the package once, before the workers start: the CLI tests start hundreds of
    ``python -m pipeplan`` processes, and where ``PYTHONDONTWRITEBYTECODE`` is set each of them
    would compile every module it imports anew."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        import compileall

        compileall.compile_dir(str(SRC), quiet=1)
