"""The planning progress bar: movement within a planner by its estimate, and what it says."""

import io
import re
import time

import pytest

from pipeplan.cli.progress import CAP, fill, planning_progress, step_text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_fill_moves_within_a_planner_but_never_past_its_slot():
    assert fill(2, 5.0, None) == 2.0
    assert fill(2, 5.0, 10.0) == 2.5
    assert fill(2, 50.0, 10.0) == 2 + CAP < 3


def test_step_text_names_the_planner_and_its_estimate():
    assert step_text("comparing", "exact", 2, 5, 60.0) == "comparing: exact (3/5, up to 60 s; Ctrl-C stops)"
    assert "up to" not in step_text("comparing", "dp", 0, 5, None)


def test_no_bar_off_a_terminal():
    with planning_progress("x", io.StringIO()) as step:
        assert step is None


def test_the_bar_draws_on_a_terminal():
    out = _Terminal()
    with planning_progress("planning", out) as step:
        step("exact", 0, 2, 60.0)
        time.sleep(0.3)
    assert "exact (1/2, up to 60 s" in out.getvalue()


def test_the_workers_bar_counts_what_every_rank_finished():
    """Off a terminal no bar; on one, the bar counts the slowest rank's step - 1, the text
    names it, and set-up is said until every rank reported a step."""
    from types import SimpleNamespace as P

    from pipeplan.cli.progress import workers_progress, workers_text

    assert workers_text("running", {0: "started"}, {0: 0}, 2, 5).startswith("running: starting 2 worker processes")
    text = workers_text("running", {0: "iteration 3 of 5", 1: "forward of microbatch 2"}, {0: 3, 1: 2}, 2, 5)
    assert text == "running: 2 of 5, rank 1: forward of microbatch 2 (Ctrl-C stops)"
    with workers_progress("running", 2, 5, io.StringIO()) as update:
        assert update is None
    out = _Terminal()
    with workers_progress("running", 2, 5, out) as update:
        update(P(rank=0, label="iteration 2 of 5", step=2))
        update(P(rank=1, label="iteration 4 of 5", step=4))
        time.sleep(0.3)
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "running: 2 of 5, rank 0" in drawn and "━" in drawn


@pytest.mark.slow
def test_a_run_reports_every_iteration_of_every_rank():
    """``run_plan``'s progress: each rank reports iterations 1 .. warmup + steps, in order
    (what the run bar counts)."""
    from pipeplan.runtime.executor import RunConfig, run_plan
    from test_runtime import plan_for

    seen: dict[int, list[int]] = {}
    run_plan(plan_for("1f1b", "split", 2, 2), RunConfig("example:mlp", steps=3, warmup=1),
             on_progress=lambda msg: seen.setdefault(msg.rank, []).append(msg.step))
    assert sorted(seen) == [0, 1]
    for steps in seen.values():
        assert steps == sorted(steps) and steps[-1] == 4 and steps[0] in (0, 1)


@pytest.mark.slow
def test_calibration_workers_report_each_of_their_steps():
    """calibrate's workers report steps 1 .. ``worker_steps`` (together, each alone, the
    all-reduce, each link: 2 + 2 + 1 for two workers), what its bar counts to."""
    from pipeplan.runtime.calibrate import calibrate, worker_steps

    seen: dict[int, set[int]] = {}
    calibrate(workers=2, seconds=0.2, on_progress=lambda msg: seen.setdefault(msg.rank, set()).add(msg.step))
    assert worker_steps(2) == 5 and sorted(seen) == [0, 1]
    for steps in seen.values():
        assert max(steps) == 5 and steps <= {0, 1, 2, 3, 4, 5}
