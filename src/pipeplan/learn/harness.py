"""What every learning planner's training loop shares: a budget (evaluations, wall-clock
only as a cap: ``budget.py``), seeding, the learning curve (CSV and PNG), checkpoints (``.pt`` with the
agent's config and the pipeplan version) and progress reports.

The loop of an agent lives in its own module; it calls ``Budget.left``, ``Curve.add`` and
``report`` and ends with ``checkpoint``. Nothing here prints: progress goes to a callback
(the CLI draws a rich bar with it).
"""

from __future__ import annotations

import csv
import io
import random
from dataclasses import asdict, dataclass, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
import torch

from ..budget import Budget  # noqa: F401  (the learning loops' budget)
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
                 step_label: str = "update") -> None:
        self.points: list[Point] = []
        self.labels = (reward_label, baseline_label, step_label)

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
        """Reward and baseline against steps, best iteration time against wall-clock."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(9, 3.4), dpi=110)
        left, right = fig.subplots(1, 2)
        steps = [p.step for p in self.points]
        left.plot(steps, [p.mean_reward for p in self.points], label=self.labels[0])
        left.plot(steps, [p.baseline for p in self.points], label=self.labels[1])
        left.set_xlabel(self.labels[2])
        left.legend(loc="lower right", fontsize=8)
        right.step([p.elapsed_s for p in self.points], [p.best_iteration_s for p in self.points], where="post")
        right.set_xlabel("training time (s)")
        right.set_ylabel("best iteration time (s)")
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
