"""The README's example outputs are what the commands print (issue: the "what would fit"
message on zoo:t5-11b / 1080ti-4x2 and the exact-incomplete mark)."""

import re
import shlex
from pathlib import Path

import pytest

from pipeplan.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _example(command_start: str) -> tuple[list[str], list[str]]:
    """The README block whose command starts with ``command_start``: (argv, output lines)."""
    for block in re.findall(r"```\n(.*?)```", README.read_text(), re.S):
        lines = block.splitlines()
        if lines and lines[0].startswith("$ " + command_start):
            return shlex.split(lines[0][2:])[1:], lines[1:]
    raise AssertionError(f"README has no example of {command_start!r}")


def _cells(row: str) -> list[str]:
    """A table row's cells, less those that vary between runs (search seconds) and those the
    README elides (``...``)."""
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    return [c for c in cells if not re.fullmatch(r"[\d.]+ s|\.\.\.", c)]


def _within(shown: list[str], printed: list[str]) -> bool:
    """``shown``'s cells appear in ``printed``, in order."""
    rest = iter(printed)
    return all(any(c == p for p in rest) for c in shown)


@pytest.mark.slow
def test_what_would_fit_example(capsys):
    argv, shown = _example("pipeplan plan --model zoo:t5-11b")
    assert main(argv) == 0
    assert " ".join(capsys.readouterr().err.split()) == " ".join(" ".join(shown).split())


@pytest.mark.slow
def test_exact_incomplete_example(capsys):
    argv, shown = _example("pipeplan compare --model zoo:alexnet")
    main(argv)
    printed = capsys.readouterr().out.splitlines()
    rows = [ln for ln in shown if ln.startswith("│")]
    assert any("incomplete (1)" in r for r in rows) and all(">=" in r for r in rows)
    note = "(1) exact: search incomplete: the 2 s time cap ran out"
    assert note in shown and note in printed
    table = [ln for ln in printed if ln.startswith("│")]
    assert len(table) == len(rows) and all(_within(_cells(r), _cells(p)) for r, p in zip(rows, table)), table
    assert shown[-1] in printed


def test_megatron_export_example(tmp_path, capsys, monkeypatch):
    """The README's export-plan example prints what the command prints for the plan the line
    before it makes."""
    plan_cmd = re.search(r"`(pipeplan plan --model zoo:llama3-8b[^`]*)`", README.read_text()).group(1)
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(plan_cmd)[1:]) == 0
    argv, shown = _example("pipeplan export-plan plan.json --to megatron")
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == shown


def _session(first: str) -> list[str]:
    """The README block of ``$ `` commands whose first line starts with ``first``, with the
    shell variables it sets substituted in the lines after it."""
    for block in re.findall(r"```\n(.*?)```", README.read_text(), re.S):
        lines = [ln[2:] for ln in block.splitlines() if ln.startswith("$ ")]
        if lines and lines[0].startswith(first):
            name, value = lines[0].split("=", 1)
            value = shlex.split(value)[0]
            return [ln.replace(f'"${name}"', shlex.quote(value)) for ln in lines[1:]]
    raise AssertionError(f"README has no session starting {first!r}")


@pytest.mark.slow
def test_the_llama_flow_to_torchtitan_and_torchrun(tmp_path, capsys, monkeypatch):
    """The README's Llama session, command by command: plan, export torch's pipelining schedule
    CSV (zero-bubble H1 has no name in torch), the CSV trained on torch's runtime equal to
    one process, and the launcher under torchrun (on loopback, a free port) passing the same
    check (on rank 0; every rank holds the whole result)."""
    import os
    import subprocess
    import sys

    from test_torchrun import TORCHRUN, _free_port

    monkeypatch.chdir(tmp_path)
    commands = _session("SPEC=")
    assert [c.split()[0] for c in commands] == ["pipeplan", "pipeplan", "pipeplan", "torchrun"]
    for command in commands[:3]:
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "titan").iterdir()) == ["pp_schedule.csv"]
    assert "one-process training" in (out := capsys.readouterr().out) and out.rstrip().endswith(": PASS")
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not beside this Python")
    argv = shlex.split(commands[3].replace("29500", str(_free_port())))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([str(TORCHRUN), *argv[1:]], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("check pass") == 1 and done.stdout.count("checked on rank 0") == 3
    assert done.stdout.count("4 processes (cpu, fp32)") == 4


@pytest.mark.slow
def test_from_a_plan_to_a_running_job(tmp_path, capsys, monkeypatch):
    """The README's path, command by command: the plan, its explanation, the Megatron Slurm job
    (bash parses it; it names the plan's degrees) and torchtitan's folder with its launch line."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    block = next(b for b in re.findall(r"```\n(.*?)```", README.read_text(), re.S)
                 if b.startswith("$ pipeplan plan --model zoo:llama3-70b"))
    commands = [ln[2:] for ln in block.splitlines() if ln.startswith("$ ")]
    assert [c.split()[1] for c in commands] == ["plan", "explain", "report", "export-plan", "export-plan"]
    for command in commands:
        argv, _, target = command.partition(" > ")
        assert main(shlex.split(argv)[1:]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        if target:
            (tmp_path / target).write_text(out)
    assert subprocess.run(["bash", "-n", "train.sbatch"]).returncode == 0
    assert (tmp_path / "plan.html").read_text().count('id="memory-table"') == 1
    job = (tmp_path / "train.sbatch").read_text()
    assert "#SBATCH --nodes=8" in job and "pretrain_gpt.py" in job and "--rotary-base 500000" in job
    assert sorted(p.name for p in (tmp_path / "titan").iterdir()) == ["launch-0.3.sh", "launch.sh",
                                                                     "pipeplan_torchtitan.py", "torchtitan.toml"]
