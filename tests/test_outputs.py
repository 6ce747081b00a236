"""Output files: every target is checked before any work, and a command writes all its
outputs or none (issue: a command line people trust, item 1)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pipeplan.cli import main
from pipeplan.errors import PipeplanError
from pipeplan.outputs import Outputs

PLAN = ["plan", "--model", "zoo:alexnet", "--cluster", "v100x4", "--planner", "gpipe"]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def one_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err


def test_a_symlink_is_refused_and_left_as_it_is(tmp_path, capsys):
    target = tmp_path / "real.json"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    one_error(*run_cli([*PLAN, "--out", str(link)], capsys), "symbolic link", str(target))
    assert link.is_symlink() and target.read_text() == "keep"


def test_a_fifo_is_refused(tmp_path, capsys):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    one_error(*run_cli([*PLAN, "--out", str(fifo)], capsys), "not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_device_is_refused_and_not_replaced(capsys):
    one_error(*run_cli(["simulate", "missing.json", "--trace", "/dev/full"], capsys), "--trace /dev/full",
              "not a regular file")
    one_error(*run_cli([*PLAN, "--out", "/dev/full"], capsys), "not a regular file")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_directory_or_a_file_as_parent_is_refused(tmp_path, capsys):
    (tmp_path / "d.json").mkdir()
    one_error(*run_cli([*PLAN, "--out", str(tmp_path / "d.json")], capsys), "is a directory")
    (tmp_path / "f").write_text("x")
    one_error(*run_cli([*PLAN, "--out", str(tmp_path / "f" / "p.json")], capsys), "is not a directory")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_place_where_no_file_can_be_made_is_refused_before_any_work(tmp_path, capsys):
    trace = tmp_path / "ok.json"
    plan = tmp_path / "plan.json"
    assert main([*PLAN, "--out", str(plan)]) == 0
    one_error(*run_cli(["simulate", str(plan), "--trace", str(trace), "--gantt", "/proc/self/g.png"], capsys),
              "--gantt", "cannot create a file")
    assert not trace.exists()  # all outputs or none


def test_the_extension_decides_the_format(tmp_path, capsys):
    one_error(*run_cli(["compare", "--model", "zoo:alexnet", "--cluster", "v100x4", "--gantt",
                        str(tmp_path / "g.jpg")], capsys), ".png, .svg, .pdf")
    one_error(*run_cli([*PLAN, "--out", str(tmp_path / "plan.yaml")], capsys), ".json")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        out = tmp_path / "sub" / "p.json"
        assert main([*PLAN, "--out", str(out)]) == 0
        assert stat.S_IMODE(os.stat(out).st_mode) == mode
        os.chmod(out, 0o640)
        assert main([*PLAN, "--out", str(out)]) == 0
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_failing_writer_leaves_nothing(tmp_path):
    outs = Outputs()
    outs.want("--trace", str(tmp_path / "t.json"), "json")
    outs.want("--gantt", str(tmp_path / "g.png"), "figure")
    outs.set("--trace", lambda p: Path(p).write_text("{}"))

    def fail(p: str) -> None:
        raise OSError(28, "No space left on device")

    outs.set("--gantt", fail)
    with pytest.raises(PipeplanError, match=r"--gantt .*\(No space left on device\); nothing was written"):
        outs.write_all()
    assert not list(tmp_path.iterdir())  # neither output, no temporary file


def _two_old_outputs(tmp_path: Path) -> Outputs:
    (tmp_path / "t.json").write_text("old trace")
    (tmp_path / "p.json").write_text("old plan")
    outs = Outputs()
    outs.want("--trace", str(tmp_path / "t.json"), "json")
    outs.want("--out", str(tmp_path / "p.json"), "json")
    outs.set("--trace", lambda p: Path(p).write_text("new trace"))
    return outs


def test_a_target_changed_while_the_work_ran_leaves_every_file_as_it_was(tmp_path):
    """The targets are checked again before any rename: a folder made where an output goes
    (a concurrent change) is refused, and "nothing was written" is true."""
    outs = _two_old_outputs(tmp_path)

    def write_and_meanwhile(p: str) -> None:
        Path(p).write_text("new plan")
        (tmp_path / "p.json").unlink()
        (tmp_path / "p.json").mkdir()  # what another process did meanwhile

    outs.set("--out", write_and_meanwhile)
    with pytest.raises(PipeplanError, match=r"--out .*is a directory.*; nothing was written"):
        outs.write_all()
    assert (tmp_path / "t.json").read_text() == "old trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "t.json"]  # no temporary or kept copy


def test_a_rename_that_fails_puts_back_the_ones_before_it(tmp_path, monkeypatch):
    outs = _two_old_outputs(tmp_path)
    outs.set("--out", lambda p: Path(p).write_text("new plan"))
    real, calls = os.replace, []

    def second_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(PipeplanError, match=r"\(Input/output error\); nothing was written"):
        outs.write_all()
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / "t.json").read_text() == "old trace" and (tmp_path / "p.json").read_text() == "old plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "t.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_replaced_file_keeps_its_owner_group_and_mode(tmp_path):
    out = tmp_path / "p.json"
    out.write_text("{}")
    os.chown(out, 65534, 65534)
    os.chmod(out, 0o640)
    assert main([*PLAN, "--out", str(out)]) == 0
    st = os.stat(out)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
    assert out.read_text() != "{}"


def test_another_users_file_is_refused_where_its_owner_cannot_be_kept(tmp_path, monkeypatch, capsys):
    out = tmp_path / "p.json"
    out.write_text("keep")
    mine = os.stat(out)
    monkeypatch.setattr(os, "geteuid", lambda: mine.st_uid + 1)  # as if another, unprivileged user
    one_error(*run_cli([*PLAN, "--out", str(out)], capsys), "belongs to another user")
    assert out.read_text() == "keep"
