"""The planning progress bar: movement within a planner by its estimate, and what it says."""

import io
import time

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
