"""``pipeplan dynamic bench|train|eval`` (cli/dynamic.py): the JSON interface, the files a
training writes, and bad inputs as one-line errors with exit code 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeplan.cli import main
from pipeplan.dynamic.machines import DEFAULT_MACHINE, MACHINE_FORMAT

SRC = Path(__file__).resolve().parents[1] / "src"


def model(op_s: float = 2e-6, flop_rate: float = 1e10, element_rate: float = 5e9) -> dict:
    """A machine model written by hand (what ``machines.calibrated_model`` measures)."""
    return {"format": MACHINE_FORMAT, "cpu": {"op_s": op_s, "flop_rate": flop_rate, "element_rate": element_rate},
            "measured": {"at": "2026-01-01T00:00:00+00:00", "host": "test"}}


@pytest.fixture(autouse=True)
def machine_file(tmp_path, monkeypatch) -> Path:
    """Every test in its own folder, whose default machine model is ``model()``: no
    calibration, the same simulated CPU in every run."""
    monkeypatch.chdir(tmp_path)
    DEFAULT_MACHINE.parent.mkdir()
    DEFAULT_MACHINE.write_text(json.dumps(model()))
    return tmp_path / DEFAULT_MACHINE


def run(capsys, *argv):
    code = main(["dynamic", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_json_lists_every_baseline(capsys):
    code, out, _ = run(capsys, "bench", "--net", "mathfunc", "--test-trees", "5", "--train-trees", "5", "--json")
    data = json.loads(out)
    assert code == 0 and data["devices"] == ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    base = data["baselines"]
    assert set(base) >= {"cpu", "gpu", "random", "heft", "optimal"}
    # the optimum is a lower bound of every placement on its trees
    sub = data["optimal_subset"]
    assert sub["optimal_ms"] <= min(sub["heft_ms"], sub["cpu_ms"]) + 1e-9


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_train_writes_checkpoint_and_curve_then_eval_reads_it(capsys, tmp_path):
    ckpt = tmp_path / "dp.pt"
    code, out, _ = run(capsys, "train", "--net", "treelstm", "--simulated", "cpu+2gpu", "--episodes", "60",
                       "--train-trees", "20", "--test-trees", "4", "--out", str(ckpt), "--json")
    data = json.loads(out)
    assert code == 0 and data["episodes"] == 60 and data["policy_ms"] > 0
    assert ckpt.exists() and (tmp_path / "dp.csv").exists() and (tmp_path / "dp.png").exists()
    assert data["optimal_subset"]["optimal_ms"] <= data["optimal_subset"]["policy_ms"] + 1e-9
    code, out, _ = run(capsys, "eval", "--checkpoint", str(ckpt), "--simulated", "cpu+2gpu", "--test-trees", "4",
                       "--json")
    assert code == 0 and json.loads(out)["policy_ms"] == pytest.approx(data["policy_ms"])
    code, out, _ = run(capsys, "eval", "--checkpoint", str(ckpt), "--simulated", "cpu+2gpu", "--test-trees", "4")
    assert code == 0 and "learned policy (DQN)" in out and "heft" in out


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_bench_on_real_logical_cpus(capsys):
    code, out, _ = run(capsys, "bench", "--net", "mathfunc", "--devices", "cpu,cpu:1", "--test-trees", "3",
                       "--train-trees", "3", "--repeats", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["reward"] == "measured" and data["baselines"]["gpu"] is None


@pytest.mark.parametrize("argv, words", [
    (["eval"], "--checkpoint is required"),
    (["bench", "--checkpoint", "x.pt"], "--checkpoint goes with eval"),
    (["bench", "--out", "x.pt"], "--out and --budget go with train"),
    (["bench", "--simulated", "cpu+4tpu"], "expected parts like cpu"),
    (["bench", "--simulated", "4gpu"], "needs a CPU"),
    (["bench", "--devices", "cpu,npu:0"], "expected cpu, cpu:K or cuda:K"),
    (["bench", "--devices", "cuda:99"], "no such CUDA device"),
    (["train", "--out", "model.txt"], "--out"),
    (["eval", "--checkpoint", "/nonexistent/x.pt"], "no such file"),
    (["bench", "--width", "1000000000"], "width 1,000,000,000 is out of range"),
    (["bench", "--net", "mathfunc", "--width", "1000000000"], "width 1,000,000,000 is out of range"),
    (["bench", "--machine", "m.json", "--devices", "cpu"], "--machine goes with the simulated machine"),
    (["bench", "--machine", "/dev/null/m.json"], "--machine /dev/null/m.json: /dev/null is not a directory"),
    (["bench", "--machine", "."], "--machine '.': is a directory"),
    (["bench", "--machine", "/dev/null"], "--machine '/dev/null': is a character device, not a regular file"),
])
def test_bad_inputs_are_one_line_errors(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and words in err and err.count("\n") == 1 and not out


def test_checkpoint_for_other_devices_is_refused(capsys, tmp_path):
    ckpt = tmp_path / "dp.pt"
    assert run(capsys, "train", "--net", "mathfunc", "--simulated", "cpu+gpu", "--episodes", "5", "--train-trees", "5",
               "--test-trees", "2", "--out", str(ckpt), "--json")[0] == 0
    code, _, err = run(capsys, "eval", "--checkpoint", str(ckpt), "--simulated", "cpu+4gpu")
    assert code == 2 and "places on 2 devices, this machine has 5" in err


BENCH = ("bench", "--net", "treelstm", "--width", "64", "--test-trees", "4", "--train-trees", "2", "--json")


def bench_json() -> str:
    """``dynamic bench --json`` in a process of its own (its own torch, its own calibration)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "pipeplan", "dynamic", *BENCH],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_simulated_results_repeat_across_processes_on_one_machine_model(tmp_path, capsys):
    """Two processes give the same numbers to the last digit (this one, whatever earlier tests
    left in it, and a fresh one); a CPU twice as slow at everything doubles the all-CPU time
    exactly (the simulator charges the model's CPU)."""
    code, first, _ = run(capsys, *BENCH)
    assert code == 0 and bench_json() == first
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(model(4e-6, 5e9, 2.5e9)))
    code, out, _ = run(capsys, *BENCH, "--machine", str(slow))
    cpu = json.loads(first)["baselines"]["cpu"]
    assert code == 0 and json.loads(out)["baselines"]["cpu"] == pytest.approx(2 * cpu, rel=1e-12)


def test_a_missing_machine_model_is_measured_once_and_shared(capsys, tmp_path, monkeypatch):
    from pipeplan.dynamic import machines

    calls = []
    monkeypatch.setattr(machines, "calibrated_model", lambda: calls.append(1) or model(3e-6))
    path = tmp_path / "new" / "m.json"
    argv = ("bench", "--net", "mathfunc", "--test-trees", "2", "--train-trees", "2", "--machine", str(path), "--json")
    code, first, err = run(capsys, *argv)
    assert code == 0 and calls == [1] and f"its model goes to {path}" in err
    assert json.loads(path.read_text()) == model(3e-6)
    code, second, err = run(capsys, *argv)
    assert code == 0 and calls == [1] and not err and first == second


def test_eval_uses_the_machine_model_the_checkpoint_trained_on(capsys, machine_file):
    code, out, _ = run(capsys, "train", "--net", "mathfunc", "--simulated", "cpu+gpu", "--episodes", "5",
                       "--train-trees", "5", "--test-trees", "3", "--out", "dp.pt", "--json")
    trained = json.loads(out)
    assert code == 0
    machine_file.write_text(json.dumps(model(1e-5)))  # the default changes; the checkpoint keeps its own
    argv = ("eval", "--checkpoint", "dp.pt", "--net", "mathfunc", "--simulated", "cpu+gpu", "--test-trees", "3", "--json")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and json.loads(out)["baselines"] == trained["baselines"]
    assert json.loads(out)["policy_ms"] == trained["policy_ms"]
    code, out, _ = run(capsys, *argv, "--machine", str(machine_file))  # unless told otherwise
    assert code == 0 and json.loads(out)["baselines"]["cpu"] > trained["baselines"]["cpu"]


@pytest.mark.parametrize("content, words", [
    ("{", "not valid JSON"),
    ("[]", "not a pipeplan machine model"),
    (json.dumps({**model(), "format": "other/1"}), "not a pipeplan machine model"),
    (json.dumps(model(op_s=-1.0)), "cpu 'op_s' must be a positive number, got -1.0"),
    (json.dumps({**model(), "cpu": {"op_s": "fast"}}), "cpu 'op_s' must be a positive number, got 'fast'"),
])
def test_bad_machine_models_are_one_line(capsys, machine_file, content, words):
    machine_file.write_text(content)
    code, out, err = run(capsys, "bench")
    assert code == 2 and words in err and err.count("\n") == 1 and not out
