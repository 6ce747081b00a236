"""What would fit (planners/advice.py): the warning names the printed plan's own time, and
following the change it prints (the flags as printed) gives a plan that fits, in the time it
says."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from pipeplan.cli import main
from pipeplan.graph import Graph, save_graph
from pipeplan.units import fmt_bytes, fmt_bytes_up, fmt_time, parse_bytes

WARNING = re.compile(r"warning: the plan does not fit in memory: .* \((\S+), (\S+ \S+) per iteration\); "
                     r"one would with .*?: (--\S+ \S+(?: --\S+ \S+)*)(?: \(on a cluster whose devices have it\))?, "
                     r"with which (\S+) plans (\S+ \S+) per iteration$")


def _plan(capsys, argv: list[str]) -> tuple[dict, str]:
    assert main(["plan", *argv, "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err.strip()


def _follow(argv: list[str], flags: str) -> list[str]:
    """``argv`` with each ``--flag value`` of ``flags`` set (replaced where given already)."""
    argv = list(argv)
    words = shlex.split(flags)
    for flag, value in zip(words[::2], words[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def _gap_graph(tmp_path) -> str:
    """Two layers of 11 MB of weights: the plan needs 42.34 MiB a device, which 0.04 GiB
    (40.96 MiB, the old advice) is not."""
    g = Graph.chain("c", [1e-3, 1e-3], [2e-3, 2e-3], params=[1.1e7, 1.1e7], act=[1e5, 1e5])
    save_graph(g, tmp_path / "g.json")
    return str(tmp_path / "g.json")


CASES = {  # advice kind: the command that overflows
    "optimizer": ["--model", "zoo:bert-large", "--cluster", "v100x4", "--memory-limit", "1GiB",
                  "--microbatches", "4"],
    "microbatches": ["--model", "zoo:vgg19?microbatch=6", "--cluster", "v100x4", "--optimizer", "sgd",
                     "--memory-limit", "0.9GiB", "--microbatches", "4"],  # down to 1 sample: 24 microbatches
    "memory": ["--model", "{gap}", "--cluster", "hier:servers=1,gpus=2,intra=10Gbps", "--memory-limit", "1MiB",
               "--microbatches", "2"],
}


@pytest.mark.parametrize("kind", CASES)
def test_following_the_advice_fits_in_the_time_it_says(kind, capsys, tmp_path):
    argv = [a.replace("{gap}", _gap_graph(tmp_path)) if a == "{gap}" else a for a in CASES[kind]]
    argv += ["--planner", "spp"]
    printed, err = _plan(capsys, argv)
    m = WARNING.search(err)
    assert m and printed["prediction"]["over_memory"], err
    assert (m.group(1), m.group(2)) == (printed["planner"], fmt_time(printed["iteration_s"]))
    assert {"optimizer": "--optimizer", "microbatches": "--global-batch", "memory": "--memory-limit"}[kind] \
        in m.group(3)
    followed, err = _plan(capsys, _follow(argv, m.group(3)))
    assert not followed["prediction"]["over_memory"] and "warning" not in err, err
    assert (followed["planner"], fmt_time(followed["iteration_s"])) == (m.group(4), m.group(5))


@pytest.mark.parametrize("n", [42.34 * 2**20, 2**30, 2.5 * 2**30 + 1, 1000.0, 0.5, 1023.999, 5 * 2**40])
def test_memory_is_suggested_rounded_up(n):
    text = fmt_bytes_up(n)
    assert parse_bytes(text) >= n and text.endswith(fmt_bytes(n).split()[1])
