"""Where a run's workers compute (``pipeplan run --device``, ``--precision``): CPU processes
over gloo, or one GPU a process over NCCL, each on ``cuda:LOCAL_RANK`` (the launcher sets the
current device: the rank when it spawns the workers, torchrun's ``LOCAL_RANK`` when joined),
in fp32 or with bf16 autocast (``torch.autocast``: matrix products in bf16, reductions and
the loss in fp32; the optimizer's state stays fp32, as in mixed-precision training).

``auto`` picks CUDA when it is present with a GPU for each local process, else the CPU: the
CPU path is the same as before this option existed. pipeplan's own executor (stages on
different numbers of devices) matches its messages by tags, which NCCL ignores: it runs on
CPU processes only."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from ..errors import PipeplanError

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Target:
    """The resolved device type (``cpu`` or ``cuda``) and precision of a run."""

    device: str = "cpu"
    precision: str = "fp32"

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def torch_device(self) -> torch.device:
        """This process's device: the current GPU (set by the launcher) or the CPU."""
        return torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")

    def autocast(self) -> AbstractContextManager:
        """bf16 autocast on this device type, or a context that changes nothing (fp32)."""
        return torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.precision == "bf16")


def resolve(device: str, precision: str, local_processes: int, *, cuda_count: int | None = None) -> Target:
    """The run's ``Target`` for ``--device`` and ``--precision``, or one line on why not:
    ``local_processes`` GPUs must be visible for ``cuda`` (``auto`` then falls back to the CPU).
    ``cuda_count``: the GPUs visible (``torch.cuda.device_count()`` when not given)."""
    if device not in DEVICES:
        raise PipeplanError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if precision not in PRECISIONS:
        raise PipeplanError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    count = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if cuda_count is None else cuda_count
    if device == "cuda" and count < local_processes:
        raise PipeplanError(f"--device cuda: this run needs {local_processes} GPUs on this machine (one a process), "
                            f"{count} visible")
    if device == "auto":
        device = "cuda" if count >= local_processes > 0 else "cpu"
    return Target(device, precision)
