"""A progress bar for planning (rich, on a terminal's stderr): which planner runs, elapsed
time and an estimate of what is left. Within one planner the bar moves with the time the
planner's own estimate gives it (``PlannerInfo.estimate``), so a long search shows movement,
not a frozen bar; it never reaches the next planner's mark before that planner starts."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

#: the share of a planner's slot the bar may fill while it runs past its estimate
CAP = 0.95


def fill(i: int, elapsed_s: float, estimate_s: float | None) -> float:
    """Planners done so far, fractionally: ``i`` finished, the running one ``elapsed_s`` into
    an ``estimate_s`` (None: no estimate, no movement within it)."""
    if not estimate_s or estimate_s <= 0:
        return float(i)
    return i + min(CAP, elapsed_s / estimate_s)


def step_text(what: str, name: str, i: int, n: int, estimate_s: float | None) -> str:
    """The bar's description while planner ``name`` (``i`` of ``n``, from 0) runs."""
    hint = f", up to {estimate_s:,.0f} s" if estimate_s and estimate_s >= 1 else ""
    return f"{what}: {name} ({i + 1}/{n}{hint}; Ctrl-C stops)"


def _terminal(stream):
    """``stream`` (default stderr) if it is a terminal, else None."""
    stream = sys.stderr if stream is None else stream
    return stream if stream.isatty() else None


def _bar(stream):
    """A transient rich bar on ``stream``: description, bar, elapsed, estimate left."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=Console(file=stream), transient=True)


@contextmanager
def planning_progress(what: str, stream=None) -> Iterator[Callable | None]:
    """Yields the callback ``planners.compare`` takes (planner, index, count, estimate), or
    None when ``stream`` (default stderr) is not a terminal."""
    stream = _terminal(stream)
    if stream is None:
        yield None
        return
    now: dict = {"i": 0, "t0": time.monotonic(), "est": None}
    stop = threading.Event()
    with _bar(stream) as bar:
        task = bar.add_task(what, total=None)

        def tick() -> None:
            while not stop.wait(0.25):
                bar.update(task, completed=fill(now["i"], time.monotonic() - now["t0"], now["est"]))

        def step(name: str, i: int, n: int, estimate_s: float | None = None) -> None:
            now.update(i=i, t0=time.monotonic(), est=estimate_s)
            bar.update(task, total=n, completed=i, description=step_text(what, name, i, n, estimate_s))
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield step
        finally:
            stop.set()
            ticker.join()


def training_text(what: str, best_s: float, updates: int, evaluations: int) -> str:
    """The bar's description while an agent trains: the best plan so far."""
    best = "none yet" if not best_s < float("inf") else f"{best_s * 1e3:,.1f} ms"
    return f"{what}: best {best}, {updates} updates, {evaluations:,} plans scored (Ctrl-C stops)"


@contextmanager
def training_progress(what: str, stream=None) -> Iterator[Callable | None]:
    """Yields the callback a training loop takes (``learn.harness.Progress``: the latest
    curve point and the fraction of the budget spent), or None off a terminal."""
    stream = _terminal(stream)
    if stream is None:
        yield None
        return
    with _bar(stream) as bar:
        task = bar.add_task(what, total=1.0)

        def update(point, fraction: float) -> None:
            bar.update(task, completed=fraction,
                       description=training_text(what, point.best_iteration_s, point.step, point.evaluations))
        yield update


def workers_text(what: str, labels: dict[int, str], steps: dict[int, int], world: int, total: int) -> str:
    """The bar's description while worker processes run: how many started, then the step of
    the rank furthest behind and what it does."""
    if len(steps) < world or min(steps.values()) == 0:
        return f"{what}: starting {world} worker processes ({len(labels)} up; Ctrl-C stops)"
    r = min(steps, key=lambda k: (steps[k], k))
    return f"{what}: {steps[r]} of {total}, rank {r}: {labels[r]} (Ctrl-C stops)"


@contextmanager
def workers_progress(what: str, world: int, total: int, stream=None) -> Iterator[Callable | None]:
    """Yields the callback ``runtime.launch`` takes (each rank's ``Progress``: its label and
    step, 1 .. ``total``), or None off a terminal. The bar counts the steps every rank has
    finished (the slowest rank's step - 1)."""
    stream = _terminal(stream)
    if stream is None:
        yield None
        return
    labels: dict[int, str] = {}
    steps: dict[int, int] = {}
    with _bar(stream) as bar:
        task = bar.add_task(f"{what}: preparing the workers (Ctrl-C stops)", total=total)

        def update(msg) -> None:
            labels[msg.rank], steps[msg.rank] = msg.label, msg.step
            done = max(min(steps.values()) - 1, 0) if len(steps) == world else 0
            bar.update(task, completed=done, description=workers_text(what, labels, steps, world, total))
        yield update
