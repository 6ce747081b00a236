"""What every search and learning planner stops on: a budget of evaluations (plans scored,
episodes), with wall-clock seconds only as an optional cap.

Evaluations make a search reproducible: the same command gives the same plan on an idle and
on a loaded machine. A seconds cap trades that for a bound on the wait, and a plan stopped by
it says so (``why_stopped``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

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
