"""What every search and learning planner stops on: a budget of evaluations (plans scored,
episodes), with wall-clock seconds only as an optional cap.

Evaluations make a search reproducible: the same command gives the same plan on an idle and
on a loaded machine. A seconds cap trades that for a bound on the wait, and a plan stopped by
it says so (``why_stopped``)."""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from .errors import PipeplanError


@dataclass
class Budget:
    """Stop after ``evaluations`` evaluations or ``seconds`` of wall-clock, whichever comes
    first (None: no limit of that kind; at least one must be set)."""

    seconds: float | None = None
    evaluations: int | None = None
    t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.seconds is None and self.evaluations is None:
            raise PipeplanError("a budget needs evaluations or seconds")
        if self.seconds is not None and not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise PipeplanError(f"a budget's seconds must be a finite number > 0, got {self.seconds}")
        if self.evaluations is not None and self.evaluations < 1:
            raise PipeplanError(f"a budget's evaluations must be >= 1, got {self.evaluations}")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def out_of_time(self) -> bool:
        return self.seconds is not None and self.elapsed >= self.seconds

    def left(self, evaluations: int) -> bool:
        """True while neither limit is reached (``evaluations``: how many were spent)."""
        if self.out_of_time():
            return False
        return self.evaluations is None or evaluations < self.evaluations

    def fraction(self, evaluations: int) -> float:
        """How much of the budget is spent, in [0, 1]."""
        parts = []
        if self.seconds is not None:
            parts.append(self.elapsed / self.seconds)
        if self.evaluations is not None:
            parts.append(evaluations / self.evaluations)
        return min(1.0, max(parts))

    def why_stopped(self, evaluations: int) -> str | None:
        """What ran out, in words (None while the budget lasts)."""
        if self.out_of_time():
            return f"the {self.seconds:g} s time cap ran out"
        if self.evaluations is not None and evaluations >= self.evaluations:
            return f"the budget of {self.evaluations:,} evaluations ran out"
        return None


@contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Run the block for at most ``seconds`` (None: no limit), else a PipeplanError naming
    ``what``: a wall-clock alarm (SIGALRM) interrupts Python code that never returns, such as a
    user model's forward that loops or sleeps (code stuck inside one C call ends with it).
    Main thread only (elsewhere the block runs unlimited)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise PipeplanError(f"{what} did not finish within {seconds:g} s (--timeout)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

