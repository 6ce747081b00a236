"""benchmarks/_results.py (provenance stamps, atomic writes) and benchmarks/check_provenance.py."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import _results  # noqa: E402
import check_provenance  # noqa: E402

ROOT = _results.ROOT


@pytest.fixture
def argv(monkeypatch):
    """This process runs as ``benchmarks/spp/gap.py --seed 0``, started from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["benchmarks/spp/gap.py", "--seed", "0"])


@pytest.mark.parametrize("cwd, script, out", [
    (".", "benchmarks/spp/gap.py", "benchmarks/results/spp"),
    ("benchmarks", "spp/gap.py", "results/spp"),
    ("benchmarks/spp", "gap.py", "../results/spp"),
    ("benchmarks/spp", "./../spp/gap.py", "../results/spp/"),
])
def test_command_is_the_same_from_any_folder(cwd, script, out):
    got = _results.command([script, "--seed", "0", "--out", out, f"--out={out}", "zoo:bert-large?microbatch=6"],
                           ROOT / cwd)
    assert got == (".venv/bin/python benchmarks/spp/gap.py --seed 0 --out benchmarks/results/spp "
                   "--out=benchmarks/results/spp 'zoo:bert-large?microbatch=6'")


def test_command_keeps_what_is_not_a_relative_path(tmp_path):
    got = _results.command([str(BENCH / "spp" / "gap.py"), "--instances", "3", "--out", str(tmp_path), "1/8"],
                           BENCH)
    assert got == f".venv/bin/python benchmarks/spp/gap.py --instances 3 --out {tmp_path} 1/8"


def test_options_that_do_not_change_figures_are_left_out_of_the_command(monkeypatch):
    """``--jobs`` (with its value, either spelling) and ``--resume`` are not recorded: the
    command kept is the one ``make bench`` runs, which gives the same figures."""
    monkeypatch.setattr(sys, "argv", ["benchmarks/learning/heldout.py", "--agents", "drl-pp", "--jobs", "2",
                                      "--resume", "--seeds", "5", "--jobs=3", "--out", "x"])
    _results.unrecorded(("--jobs",), ("--resume",))
    assert sys.argv == ["benchmarks/learning/heldout.py", "--agents", "drl-pp", "--seeds", "5", "--out", "x"]


def test_provenance_fields(argv):
    p = _results.provenance()
    assert p["command"] == ".venv/bin/python benchmarks/spp/gap.py --seed 0"
    assert p["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                         text=True).stdout.strip()
    assert isinstance(p["dirty"], bool)
    assert set(p["machine"]) == {"cpu", "cores", "os", "python", "numpy", "torch"}
    assert p["machine"]["python"] == ".".join(map(str, sys.version_info[:3]))
    host = socket.gethostname()
    assert len(host) < 5 or host not in json.dumps(p)
    assert p["date"].endswith("UTC")


def test_every_format_carries_the_stamp(argv, tmp_path):
    paths = [_results.write_json(tmp_path / "a.json", {"x": 1}),
             _results.write_markdown(tmp_path / "sub" / "a.md", "# Title\n\n| a |\n|---|\n"),
             _results.write_csv(tmp_path / "a.csv", [{"a": 1, "b": 2}, {"a": 3, "b": 4}])]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    paths.append(_results.save_figure(fig, tmp_path / "a.png", dpi=20))
    plt.close(fig)
    stamps = [_results.read_provenance(p) for p in paths]
    assert all(s is not None and s["command"] == ".venv/bin/python benchmarks/spp/gap.py --seed 0" for s in stamps)
    assert all(s["machine"] == stamps[0]["machine"] and s["commit"] == stamps[0]["commit"] for s in stamps)
    data = json.loads(paths[0].read_text())
    assert list(data) == ["provenance", "x"] and data["x"] == 1
    text = paths[1].read_text()
    assert text.startswith("---\n") and text.endswith("\n---\n\n# Title\n\n| a |\n|---|\n")
    assert paths[2].read_text().splitlines() == ["a,b", "1,2", "3,4"]
    assert (tmp_path / "a.csv.provenance.json").exists()
    assert _results.read_provenance(tmp_path / "sub") is None


def test_files_without_a_stamp_have_none(tmp_path):
    (tmp_path / "plain.json").write_text('{"x": 1}')
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "plain.md").write_text("# Title\n---\n")
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "run.log").write_text("x")
    assert all(_results.read_provenance(p) is None for p in tmp_path.iterdir())


def test_atomic_write_keeps_the_old_file_when_writing_fails(argv, tmp_path):
    path = _results.write_json(tmp_path / "a.json", {"x": 1})
    before = path.read_text()

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        _results.atomic_write(path, fail)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary file left
    (tmp_path / "plain").write_text("")
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)  # not 0600


def test_relative_paths_are_under_results():
    assert _results._target("spp/gap.json") == ROOT / "benchmarks" / "results" / "spp" / "gap.json"


def test_bench_commands_expand_make_variables(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text("VENV := .venv\nBIN := $(VENV)/bin\n\ntest:\n\t$(BIN)/python -m pytest\n\n"
                        "bench: $(STAMP)\n\t$(BIN)/python benchmarks/a.py  --x 1\n\t$(BIN)/python benchmarks/b.py\n"
                        "\nclean:\n\trm -rf out\n")
    assert check_provenance.bench_commands(makefile) == {".venv/bin/python benchmarks/a.py --x 1",
                                                         ".venv/bin/python benchmarks/b.py"}


def test_the_projects_makefile_runs_every_benchmark_script():
    commands = check_provenance.bench_commands(ROOT / "Makefile")
    scripts = {c.split()[1] for c in commands}
    on_disk = {str(p.relative_to(ROOT)) for p in BENCH.rglob("*.py")
               if not p.name.startswith("_") and p.name != "check_provenance.py"}
    assert on_disk <= scripts
    assert all(c.startswith(".venv/bin/python benchmarks/") for c in commands)


def test_check_lists_each_kind_of_offender(argv, tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commands = {".venv/bin/python benchmarks/spp/gap.py --seed 0"}
    good = _results.write_json(tmp_path / "good.json", {})
    assert check_provenance.problems(good, commands, strict=False) == []
    assert check_provenance.problems(good, {".venv/bin/python benchmarks/spp/gap.py"}, strict=False) == [
        "command not in the Makefile's bench target: '.venv/bin/python benchmarks/spp/gap.py --seed 0'"]
    stamp = {**_results.provenance(), "commit": "0" * 40, "dirty": True}
    (tmp_path / "old.json").write_text(json.dumps({"provenance": stamp}))
    assert check_provenance.problems(tmp_path / "old.json", commands, strict=True) == [
        f"commit not in the history of HEAD: '{'0' * 40}'", "written with uncommitted changes"]
    (tmp_path / "hand.md").write_text("# made by hand\n")
    assert check_provenance.problems(tmp_path / "hand.md", commands, strict=False) == ["no provenance"]
    (tmp_path / "gone.csv.provenance.json").write_text(json.dumps({"provenance": stamp}))
    assert check_provenance.problems(tmp_path / "gone.csv.provenance.json", commands, strict=False) == [
        "provenance of a missing file, gone.csv"]
    assert check_provenance.in_history(head) and not check_provenance.in_history("not-a-commit")


def test_a_resumed_run_keeps_only_rows_that_would_come_out_the_same(tmp_path):
    """heldout.py --resume: rows written at HEAD with the same seeds and evaluations are kept
    (those of instances no longer run dropped); other evaluations, or rows that are not the
    first instances of this run, are refused."""
    import argparse

    sys.path.insert(0, str(BENCH / "learning"))
    import heldout

    head = _results.git_state()[0]
    pairs = [("alexnet", "v100x4"), ("vgg16", "v100x4"), ("alexnet", "1080ti-4x2")]
    rows = [{"model": "alexnet", "cluster": "v100x4"}, {"model": "alexnet", "cluster": "drlpp-4gpu"}]
    (tmp_path / "heldout_drl-pp.json").write_text(json.dumps(
        {"provenance": {"commit": head, "dirty": False}, "seeds": 5, "evaluations": 3000, "rows": rows}))
    args = argparse.Namespace(out=tmp_path, seeds=5, evaluations=3000)
    kept, origin = heldout.resumed_rows("drl-pp", args, pairs)
    assert kept == rows[:1] and origin == [{"commit": head, "rows": 1}]
    with pytest.raises(SystemExit, match="other seeds/evaluations"):
        heldout.resumed_rows("drl-pp", argparse.Namespace(out=tmp_path, seeds=5, evaluations=100), pairs)
    with pytest.raises(SystemExit, match="other instances"):
        heldout.resumed_rows("drl-pp", args, [pairs[1], pairs[0]])


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_a_resumed_run_refuses_rows_measured_on_other_sources(tmp_path):
    """heldout.py --resume: rows written at a commit whose src/ differs from HEAD's, the row
    code being the same, are refused (they would not come out the same)."""
    import argparse

    sys.path.insert(0, str(BENCH / "learning"))
    import heldout

    now = heldout._row_code((BENCH / "learning" / "heldout.py").read_text())
    for commit in _git("rev-list", "--max-count=30", "HEAD", "--", "src").stdout.split():
        shown = _git("show", f"{commit}^:benchmarks/learning/heldout.py")
        if shown.returncode == 0 and heldout._row_code(shown.stdout) == now \
                and _git("diff", "--quiet", f"{commit}^", "HEAD", "--", "src").returncode == 1:
            before = _git("rev-parse", f"{commit}^").stdout.strip()
            break
    else:
        pytest.skip("no commit in this clone's recent history with the same row code and other src/")
    rows = [{"model": "alexnet", "cluster": "v100x4"}]
    (tmp_path / "heldout_drl-pp.json").write_text(json.dumps(
        {"provenance": {"commit": before, "dirty": False}, "seeds": 5, "evaluations": 3000, "rows": rows}))
    args = argparse.Namespace(out=tmp_path, seeds=5, evaluations=3000)
    with pytest.raises(SystemExit, match="src/ or the row code changed"):
        heldout.resumed_rows("drl-pp", args, [("alexnet", "v100x4")])


def test_a_failed_task_ends_the_worker_pool_at_once():
    """benchmarks' worker_pool: when a task fails, the workers are ended and the tasks left
    never run (leaving a plain pool's block first ran every task: a seed that crashed kept
    a held-out run going for another hour before it said so)."""
    import math
    import multiprocessing
    import time

    with pytest.raises(ValueError, match="math domain error"):
        with _results.worker_pool(2) as pool:
            failed = pool.submit(math.sqrt, -1)
            queued = [pool.submit(time.sleep, 5) for _ in range(8)]
            failed.result()
    assert all(f.cancelled() or f.exception() is not None for f in queued)  # BrokenProcessPool
    assert not multiprocessing.active_children()
