"""Time marks and tensor gathering shared by the profiler's measurements."""

from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """Time marks: ``perf_counter`` on CPU, recorded CUDA events on a GPU (read after a sync).

    A run's timeline needs each mark as a time on the host clock all ranks of a machine share:
    ``anchor`` pairs a ``perf_counter`` reading with an event recorded once the GPU is idle,
    and ``seconds`` places a later event at the anchor plus the GPU time between them (on the
    CPU a mark is already that time)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host, self._event = 0.0, None

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

    def anchor(self) -> float:
        """Wait for the device, then pair the host time (returned) with a mark."""
        self.sync()
        self._host = time.perf_counter()
        self._event = self.mark()
        return self._host

    def seconds(self, mark: Any) -> float:
        """A mark as host time (the class docstring; call ``sync`` first on a GPU)."""
        return self._host + self._event.elapsed_time(mark) / 1e3 if self.cuda else mark


def tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensors(x)]
    return []
