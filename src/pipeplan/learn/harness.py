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
import warnings
from dataclasses import MISSING, asdict, dataclass, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
import torch

from ..budget import Budget  # noqa: F401  (the learning loops' budget)
from ..errors import PipeplanError
from ..readers import regular_file


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
    sampled_s: float = float("nan")  # the median iteration of the plans the policy sampled (where an agent says)


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


#: what every checkpoint holds beside its agent's name, each a mapping
SECTIONS = ("config", "state", "trained_on")


def load_checkpoint(path: str, agent: str) -> dict:
    """A checkpoint written by ``checkpoint`` for ``agent``, its sections mappings; a one-line
    error otherwise (a FIFO or device is refused before it is opened). The loader then checks
    the contents it reads: ``config_from``, ``check_state``."""
    regular_file(path, "checkpoint")
    try:
        with warnings.catch_warnings():  # torch warns in two lines before refusing a plain pickle: one line here
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a file that is not a checkpoint
        raise PipeplanError(f"checkpoint {path!r}: not a pipeplan checkpoint ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("agent") != agent:
        found = data.get("agent") if isinstance(data, dict) else None
        raise PipeplanError(f"checkpoint {path!r}: made for {found!r}, not {agent!r}")
    for key in SECTIONS:
        if not isinstance(data.get(key), dict):
            found = "missing" if key not in data else f"a {type(data[key]).__name__}, not a mapping"
            raise PipeplanError(f"checkpoint {path!r}: its {key!r} is {found}")
    return data


def config_from(cls: type, raw: dict, path: str, **override: Any) -> Any:
    """The dataclass ``cls`` from a checkpoint's config ``raw`` (with ``override``): every
    field present and of its default's type (a tuple: a list or tuple of its default's
    element type), no other key; a one-line error naming the first field that is not."""
    unknown = sorted(set(raw) - {f.name for f in fields(cls)}, key=str)
    if unknown:
        raise PipeplanError(f"checkpoint {path!r}: config has an unknown key {unknown[0]!r}")
    values = {}
    for f in fields(cls):
        if f.name not in raw:
            raise PipeplanError(f"checkpoint {path!r}: config has no {f.name!r}")
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        values[f.name] = _typed(raw[f.name], default, f"checkpoint {path!r}: config {f.name!r}")
    return cls(**{**values, **override})


def _typed(value: Any, like: Any, where: str) -> Any:
    """``value`` as the type of ``like`` (an int is a float; a bool is no number; a field
    whose default is None is an optional number)."""
    if like is None:
        return None if value is None else _typed(value, 0.0, where)
    if isinstance(like, tuple):
        if not isinstance(value, (list, tuple)):
            raise PipeplanError(f"{where} is a {type(value).__name__}, not a list")
        return tuple(_typed(v, like[0], f"{where}[{i}]") for i, v in enumerate(value)) if like else tuple(value)
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[type(like)]
    if not isinstance(value, kinds) or (isinstance(value, bool) and not isinstance(like, bool)):
        raise PipeplanError(f"{where} is a {type(value).__name__}, not a {type(like).__name__}")
    return type(like)(value)


def trained_count(data: dict, key: str, path: str) -> int:
    """``trained_on[key]`` of a loaded checkpoint, a positive integer (e.g. its devices)."""
    value = data["trained_on"].get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        found = "missing" if value is None else repr(value) if isinstance(value, (int, float, str)) else \
            f"a {type(value).__name__}"
        raise PipeplanError(f"checkpoint {path!r}: its trained_on {key!r} is {found}, not a positive integer")
    return value


def check_state(state: dict, build: Callable[[], torch.nn.Module], path: str) -> None:
    """``state`` (a checkpoint's weights) against the network ``build()`` makes from the
    checkpoint's own hyper-parameters, built on the meta device (no memory): the same names,
    each a tensor of the same shape, floating-point and finite where the network's is (any
    precision), else of its dtype; a one-line error otherwise."""
    where = f"checkpoint {path!r}"
    try:
        with torch.device("meta"):
            expected = build().state_dict()
    except (RuntimeError, ValueError, TypeError) as e:
        raise PipeplanError(f"{where}: its config builds no network ({type(e).__name__})") from None
    missing = [k for k in expected if k not in state]
    unknown = [k for k in state if k not in expected]
    if missing or unknown:
        what = f"has no weight {missing[0]!r}" if missing else f"has an unknown weight {str(unknown[0])!r}"
        raise PipeplanError(f"{where}: {what}")
    for name, want in expected.items():
        got = state[name]
        floating = want.is_floating_point()
        if not isinstance(got, torch.Tensor) or got.is_floating_point() != floating or \
                (not floating and got.dtype != want.dtype):
            kind = f"a {got.dtype} tensor" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            raise PipeplanError(f"{where}: weight {name!r} is {kind}, not "
                                + ("floating-point" if floating else f"{want.dtype}"))
        if got.shape != want.shape:
            raise PipeplanError(f"{where}: weight {name!r} has shape {tuple(got.shape)}; its config makes "
                                f"{tuple(want.shape)}")
        if floating and not torch.isfinite(got).all():
            raise PipeplanError(f"{where}: weight {name!r} is not finite (NaN or infinite values)")


def save_bytes(data: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(data, buf)
    return buf.getvalue()
