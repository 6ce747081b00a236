"""Time marks and tensor gathering shared by the profiler's measurements."""

from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """Time marks: ``perf_counter`` on CPU, recorded CUDA events on a GPU (read after a sync)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def between(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


def tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensors(x)]
    return []
