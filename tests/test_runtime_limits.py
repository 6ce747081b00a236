"""Options of the runtime commands (run, calibrate) that would hang, never end or start
processes until the system's limit: refused in one line, exit code 2, before any work (the
work itself is replaced by a sentinel that fails the test if it is reached)."""

from __future__ import annotations

import os

import pytest

import pipeplan.plan
import pipeplan.runtime.calibrate as calibrate_mod
from pipeplan.cli import main


class WorkStarted(Exception):
    pass


def _sentinel(*args, **kwargs):
    raise WorkStarted()


@pytest.fixture
def no_work(monkeypatch):
    """Reading the plan or measuring anything fails the test."""
    monkeypatch.setattr(pipeplan.plan, "load_plan", _sentinel)
    monkeypatch.setattr(calibrate_mod, "_bench", _sentinel)
    monkeypatch.setattr(calibrate_mod, "_run_workers", _sentinel)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # an option's type refused by the argument parser
        return int(e.code)


RUN = ["run", "plan.json", "--model", "example:mlp"]
CASES = {
    "run --warmup -1": (RUN + ["--warmup", "-1"], "--warmup"),
    "run --hang-timeout nan": (RUN + ["--hang-timeout", "nan"], "--hang-timeout"),
    "run --hang-timeout 0": (RUN + ["--hang-timeout", "0"], "--hang-timeout"),
    "run --timeout nan": (RUN + ["--timeout", "nan"], "--timeout"),
    "run --timeout inf": (RUN + ["--timeout", "inf"], "--timeout"),
    "run --timeout -5": (RUN + ["--timeout", "-5"], "--timeout"),
    "calibrate --seconds inf": (["calibrate", "--seconds", "inf"], "--seconds"),
    "calibrate --seconds 1e9": (["calibrate", "--seconds", "1e9"], "--seconds"),
    "calibrate --seconds nan": (["calibrate", "--seconds", "nan"], "--seconds"),
    "calibrate --workers 100000": (["calibrate", "--workers", "100000"], "100,000 worker processes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_before_any_work(case, no_work, capsys):
    argv, fragment = CASES[case]
    code = _exit_code(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "error:" in err and fragment in err and "Traceback" not in err, err


def test_force_lets_many_workers_through(no_work, capsys):
    """--force skips the processes-a-core limit (the measurement then starts)."""
    workers = str(4 * (os.cpu_count() or 1) + 1)
    assert _exit_code(["calibrate", "--workers", workers]) == 2
    assert "unless --force" in capsys.readouterr().err
    with pytest.raises(WorkStarted):
        main(["calibrate", "--workers", workers, "--force"])


def test_the_largest_values_allowed_pass(no_work):
    """The limits are limits: zero warm-up, an hour's measurement and 4 workers a core start."""
    with pytest.raises(WorkStarted):
        main(RUN + ["--warmup", "0", "--timeout", "1e6", "--hang-timeout", "0.5"])
    with pytest.raises(WorkStarted):
        main(["calibrate", "--seconds", "3600", "--workers", str(4 * (os.cpu_count() or 1))])
