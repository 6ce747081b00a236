"""The schedule IR: kinds, validity checks, split backwards (I/W), steady state and lanes as
data, and the simulator's independence from schedule names and long functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeplan.errors import PipeplanError
from pipeplan.schedule import SCHEDULES, Kind, Program, Schedule, check_schedule, make_schedule
from pipeplan.sim import simulate

from helpers import chain_plan, one_server, uniform_chain

SIM = Path(__file__).resolve().parents[1] / "src" / "pipeplan" / "sim"


def test_kinds_are_one_intenum():
    assert [k.name for k in Kind] == ["F", "B", "SEND_F", "SEND_B", "AR", "UPDATE", "I", "W"]
    p = Program.from_actions(1, ["F0", "I0", "F1", "W0", "I1", "W1", "AR"])
    assert p.actions() == ["F0", "I0", "F1", "W0", "I1", "W1", "AR"]
    assert p.kinds.tolist() == [Kind.F, Kind.I, Kind.F, Kind.W, Kind.I, Kind.W, Kind.AR]


@pytest.mark.parametrize("actions, message", [
    (["F0", "W0", "I0"], "W0 before I0"),
    (["F0", "I0"], "I without W"),
    (["B0", "F0"], "B0 before F0"),
    (["F0", "F0", "B0", "B0"], "twice"),
    (["F0", "B1"], "other microbatches"),
    (["F0", "X0"], "cannot read"),
])
def test_bad_programs_are_refused(actions, message):
    with pytest.raises(PipeplanError, match=message):
        check_schedule(Schedule("custom", 2, [0], [Program.from_actions(0, actions)]), 1)


def test_split_backward_equals_full_backward_closed_form():
    """One device, M microbatches, F then I then W: the iteration is M (f + b), whatever the
    split of b between I and W; each W may run as late as the end."""
    g = uniform_chain(1, f=1.0, b=2.0)
    c = one_server(1)
    plan = chain_plan(g, c, [0, 1], [1], 3, "gpipe")
    acts = ["F0", "F1", "F2", "I0", "I1", "I2", "W0", "W1", "W2"]
    sched = Schedule("zb", 3, [0], [Program.from_actions(0, acts)])
    r = simulate(plan, sched)
    assert r.iteration_s == pytest.approx(3 * (1.0 + 2.0))
    assert r.efficiency == pytest.approx(1.0)


def test_split_backward_lets_weight_gradients_fill_the_drain():
    """Two stages, one microbatch: with B the first stage waits for the whole backward of the
    second; with I then W, stage 1's weight gradient overlaps stage 0's backward."""
    g = uniform_chain(2, f=1.0, b=2.0)
    c = one_server(2)
    plan = chain_plan(g, c, [0, 1, 2], [1, 1], 1, "gpipe")
    full = simulate(plan).iteration_s  # F0 F1 B1 B0: 1 + 1 + 2 + 2
    zb = Schedule("zb", 1, [0, 1], [Program.from_actions(0, ["F0", "I0", "W0"]),
                                    Program.from_actions(1, ["F0", "I0", "W0"])])
    split = simulate(plan, zb).iteration_s  # F F I1(1) I0(1) W0(1), W1 alongside
    assert full == pytest.approx(6.0)
    assert split == pytest.approx(5.0)


def test_steady_state_and_lanes_are_properties_of_the_ir():
    layouts = {"single": [[0], [1]], "loop": [[0], [1], [0], [1]], "v": [[0], [1], [1], [0]]}
    for name, kind in SCHEDULES.items():
        s = make_schedule(name, layouts[kind.placement], 4)
        assert s.steady_state == (None if kind.stream == 1 else 4)
        assert s.lanes == kind.lanes
        assert s.microbatches == 4 * kind.stream


def test_schedule_must_match_the_plan_devices():
    g = uniform_chain(2)
    plan = chain_plan(g, one_server(3), [0, 1, 2], [1, 1], 2, "1f1b")
    other = make_schedule("1f1b", [[0], [2]], 2)
    with pytest.raises(PipeplanError, match="other devices"):
        simulate(plan, other)


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_sim_functions_are_short_and_never_name_a_schedule():
    long_ones, named = [], []
    for path in sorted(SIM.glob("*.py")):
        text = path.read_text()
        for fn in _functions(ast.parse(text)):
            if fn.end_lineno - fn.lineno + 1 > 80:
                long_ones.append(f"{path.name}:{fn.name}")
        named += [f"{path.name}: {n}" for n in SCHEDULES if n in text]
    assert not long_ones
    assert not named


def test_no_function_in_the_package_is_over_80_lines():
    """The project's standard everywhere, not only in sim/."""
    long_ones = [f"{path.relative_to(SIM.parent)}:{fn.name}" for path in sorted(SIM.parent.rglob("*.py"))
                 for fn in _functions(ast.parse(path.read_text())) if fn.end_lineno - fn.lineno + 1 > 80]
    assert not long_ones
