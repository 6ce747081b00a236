"""What every learning planner's training loop shares: a budget (wall-clock and/or
evaluations), seeding, the learning curve (CSV and PNG), checkpoints (``.pt`` with the
agent's config and the pipeplan version) and progress reports.

The loop of an agent lives in its own module; it calls ``Budget.left``, ``Curve.add`` and
``report`` and ends with ``checkpoint``. Nothing here prints: progress goes to a callback
(the CLI draws a rich bar with it).
"""

from __future__ import annotations

import csv
import io
import random
import time
from dataclasses import asdict, dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
import torch

from ..errors import PipeplanError


def pipeplan_version() -> str:
    try:
        return version("pipeplan")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without install
        return "unknown"


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (an agent's weights are drawn from torch's generator)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Budget:
    """Stop after ``seconds`` of wall-clock or ``evaluations`` plans scored, whichever comes
    first (None: no limit of that kind; at least one must be set)."""

    seconds: float | None = None
    evaluations: int | None = None
    t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.seconds is None and self.evaluations is None:
            raise PipeplanError("a training budget needs seconds or evaluations")
        if (self.seconds is not None and not self.seconds > 0) or (self.evaluations is not None and self.evaluations < 1):
            raise PipeplanError(f"a training budget must be positive, got {self.seconds} s / {self.evaluations} "
                                "evaluations")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self, evaluations: int) -> bool:
        """True while neither limit is reached."""
        if self.seconds is not None and self.elapsed >= self.seconds:
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


@dataclass
class Point:
    """One row of a learning curve."""

    step: int
    elapsed_s: float
    evaluations: int
    mean_reward: float
    baseline: float
    best_iteration_s: float


Progress = Callable[[Point, float], None]  # (latest point, fraction of the budget spent)


class Curve:
    """The learning curve of one training run."""

    def __init__(self, reward_label: str = "mean reward (-ln s)", baseline_label: str = "baseline",
                 step_label: str = "update", best_label: str = "best iteration time (s)") -> None:
        self.points: list[Point] = []
        self.labels = (reward_label, baseline_label, step_label, best_label)

    def add(self, point: Point) -> None:
        self.points.append(point)

    def csv_text(self) -> str:
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow([f.name for f in fields(Point)])
        for p in self.points:
            w.writerow([getattr(p, f.name) for f in fields(Point)])
        return out.getvalue()

    def figure(self, title: str):
        """Reward and baseline against steps, and, where the run records one, the best
        iteration time against wall-clock (no empty panel)."""
        from matplotlib.figure import Figure

        best = [(p.elapsed_s, p.best_iteration_s) for p in self.points if np.isfinite(p.best_iteration_s)]
        fig = Figure(figsize=(9 if best else 5, 3.4), dpi=110)
        axes = fig.subplots(1, 2 if best else 1, squeeze=False)[0]
        steps = [p.step for p in self.points]
        axes[0].plot(steps, [p.mean_reward for p in self.points], label=self.labels[0])
        axes[0].plot(steps, [p.baseline for p in self.points], label=self.labels[1])
        axes[0].set_xlabel(self.labels[2])
        axes[0].legend(loc="lower right", fontsize=8)
        if best:
            axes[1].step(*zip(*best), where="post")
            axes[1].set_xlabel("training time (s)")
            axes[1].set_ylabel(self.labels[3])
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        return fig


def checkpoint(agent: str, config: Any, state: dict[str, torch.Tensor], trained_on: dict[str, Any]) -> dict:
    """A checkpoint's contents: the agent's name, its config (a dataclass), its weights,
    what it was trained on, and the pipeplan version."""
    return {"agent": agent, "config": asdict(config), "state": state, "trained_on": trained_on,
            "pipeplan_version": pipeplan_version()}


def load_checkpoint(path: str, agent: str) -> dict:
    """A checkpoint written by ``checkpoint`` for ``agent``; a one-line error otherwise."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PipeplanError(f"checkpoint {path!r}: no such file") from None
    except Exception as e:  # torch raises many kinds for a file that is not a checkpoint
        raise PipeplanError(f"checkpoint {path!r}: not a pipeplan checkpoint ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("agent") != agent:
        found = data.get("agent") if isinstance(data, dict) else None
        raise PipeplanError(f"checkpoint {path!r}: made for {found!r}, not {agent!r}")
    return data


def save_bytes(data: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(data, buf)
    return buf.getvalue()
