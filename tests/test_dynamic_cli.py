"""``pipeplan dynamic bench|train|eval`` (cli_dynamic.py): the JSON interface, the files a
training writes, and bad inputs as one-line errors with exit code 2."""

import json

import pytest

from pipeplan.cli import main


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
    (["bench", "--threads", "100000"], "--threads: 100,000 threads"),
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
