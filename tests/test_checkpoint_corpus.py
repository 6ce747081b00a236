"""Checkpoints that load safely but hold the wrong contents, generated: a valid tiny checkpoint
of each learning agent (DynPartition, DRL-PP, Auto-MAP inference) mutated systematically (each
section, config field, weight and device count dropped, given a wrong type, a wrong shape, a
non-finite value) must be refused by its loader in one line naming the checkpoint; a few through
the CLI; and a FIFO given as a checkpoint is refused before it is opened, never waited on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from pipeplan.cli import main
from pipeplan.errors import PipeplanError
from pipeplan.learn.harness import checkpoint

DEVICES = 4  # the DRL-PP checkpoint's accelerators (drlpp-4gpu)
Mutation = tuple[str, Callable[[dict], None]]


def dynpartition() -> tuple[dict, Callable[[str], Any], tuple[str, ...]]:
    from pipeplan.dynamic.agent import Agent, Config

    agent = Agent(2, Config(hidden=(2, 2)))  # tiny: the loader builds the network the checkpoint's config says
    return agent.checkpoint({"net": "mathfunc"}), Agent.load, ("config", "devices")


def drlpp() -> tuple[dict, Callable[[str], Any], tuple[str, ...]]:
    from pipeplan.planners.drlpp.ppo import Config, new_agent
    from pipeplan.planners.drlpp.run import AGENT, load_agent

    agent = new_agent(Config(gcn_widths=(2, 2, 2), hidden=2, accelerator_embedding=2), DEVICES)  # tiny, as above
    data = checkpoint(AGENT, agent.cfg, agent.state_dict(), {"devices": DEVICES})
    return data, lambda path: load_agent(path, DEVICES, 0), ("config", "devices")


def automap_infer() -> tuple[dict, Callable[[str], Any], tuple[str, ...]]:
    from pipeplan.learn.dqn import Agent
    from pipeplan.planners.automap.infer import AGENT, POINTS, InferEnv, config, load_agent

    agent = Agent(InferEnv.OBS, POINTS, config())
    state = {k: v.half() for k, v in agent.online.state_dict().items()}  # as `train` ships it
    return checkpoint(AGENT, agent.cfg, state, {"data": "mix"}), load_agent, ()


AGENTS = {"dynpartition": dynpartition, "drl-pp": drlpp, "automap-infer": automap_infer}


def _set(section: str, key: Any, value: Any) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        data[section][key] = value
    return apply


def _drop(section: str | None, key: Any) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        del (data if section is None else data[section])[key]
    return apply


def _wrong_type(value: Any) -> Any:
    """A value of another type than ``value``'s."""
    return "x" if value is None or isinstance(value, (int, float, list, tuple)) and not isinstance(value, bool) else 3


def mutations(data: dict, reads: tuple[str, ...]) -> Iterator[Mutation]:
    """Every mutation of ``data`` its loader must refuse: ``reads`` names what it reads beside
    the weights (its ``config``, the ``devices`` it was trained on)."""
    for key in ("agent", "config", "state", "trained_on"):
        yield f"no {key}", _drop(None, key)
        yield f"{key} a list", lambda d, k=key: d.__setitem__(k, [1, 2])
    for name, t in data["state"].items():
        yield f"no weight {name}", _drop("state", name)
        yield f"{name} reshaped", _set("state", name, torch.zeros(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype))
        yield f"{name} one more dimension", _set("state", name, t[None])
        yield f"{name} a list", _set("state", name, t.tolist())
        yield f"{name} a string", _set("state", name, "weights")
        yield f"{name} integers", _set("state", name, t.long())
        yield f"{name} NaN", _set("state", name, torch.full_like(t, float("nan")))
    yield "an unknown weight", _set("state", "extra.weight", torch.zeros(2))
    if "config" in reads:
        for name, value in data["config"].items():
            yield f"no config {name}", _drop("config", name)
            yield f"config {name} of a wrong type", _set("config", name, _wrong_type(value))
            if isinstance(value, (list, tuple)):
                yield f"config {name} of strings", _set("config", name, ["a"] * len(value))
        yield "an unknown config key", _set("config", "extra", 1)
    if "devices" in reads:
        yield "no devices", _drop("trained_on", "devices")
        for bad in ("4", 4.0, 0, -1, [4], True, None):
            yield f"devices {bad!r}", _set("trained_on", "devices", bad)


def mutated(data: dict, mutate: Callable[[dict], None]) -> dict:
    copy = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    mutate(copy)
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_every_mutated_checkpoint_is_one_line(agent, tmp_path, one_torch_thread):
    data, load, reads = AGENTS[agent]()
    path = tmp_path / "ck.pt"
    torch.save(data, path)
    load(str(path))  # the valid one loads
    wrong = []
    cases = list(mutations(data, reads))
    for what, mutate in cases:
        torch.save(mutated(data, mutate), path)
        try:
            load(str(path))
            wrong.append(f"{what}: accepted")
        except PipeplanError as e:
            if not str(e).startswith(f"checkpoint {str(path)!r}") or "\n" in str(e):
                wrong.append(f"{what}: {e}")
        except Exception as e:  # noqa: BLE001 - what the corpus looks for
            wrong.append(f"{what}: {type(e).__name__}: {e}")
    assert len(cases) > 30 and not wrong, "\n".join(wrong)


def _planner(agent: str, path: Path) -> list[str]:
    """The command that loads ``agent``'s checkpoint at ``path``."""
    if agent == "dynpartition":
        return ["dynamic", "eval", "--checkpoint", str(path), "--simulated", "cpu+gpu", "--test-trees", "2"]
    return ["plan", "--model", "zoo:alexnet", "--cluster", "drlpp-4gpu", "--planner", agent,
            "-O", f"checkpoint={path}"]


@pytest.mark.parametrize("agent", AGENTS)
def test_cli_refuses_a_checkpoint_without_weights(agent, tmp_path, capsys, one_torch_thread):
    data, _, _ = AGENTS[agent]()
    path = tmp_path / "ck.pt"
    torch.save(mutated(data, lambda d: d["state"].pop(next(iter(d["state"])))), path)
    assert main(_planner(agent, path)) == 2
    out = capsys.readouterr()
    assert out.err.startswith(f"pipeplan: error: checkpoint {str(path)!r}: has no weight ")
    assert out.err.count("\n") == 1 and not out.out


@pytest.mark.slow
def test_a_fifo_as_checkpoint_is_refused_not_waited_on(tmp_path):
    """``dynamic eval --checkpoint``, ``-O checkpoint=`` and ``--init`` (all three read through
    ``harness.load_checkpoint``), each in its own process (a blocked open cannot be interrupted
    in this one): one line and exit 2 long before the generous timeout."""
    fifo = tmp_path / "ck.pt"
    os.mkfifo(fifo)
    commands = [_planner("dynpartition", fifo), _planner("drl-pp", fifo),
                ["train", "automap-infer", "--evaluations", "8", "--init", str(fifo), "--out", str(tmp_path / "a.pt")]]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    runs = [subprocess.Popen([sys.executable, "-m", "pipeplan", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for argv in commands]
    try:
        results = [run.communicate(timeout=240) for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run, (out, err) in zip(runs, results):
        assert run.returncode == 2 and not out, err
        assert err == f"pipeplan: error: checkpoint {str(fifo)!r}: is a FIFO, not a regular file\n"


def test_a_plain_pickle_as_checkpoint_is_one_line_without_torchs_warning(tmp_path):
    """torch.load(weights_only=True) warns in two lines before refusing a pickle it will not
    run; the whole of stderr is pipeplan's one line."""
    import pickle

    path = tmp_path / "pickle.pt"
    path.write_bytes(pickle.dumps(Path("x")))  # a class torch's safe loader refuses
    run = subprocess.run([sys.executable, "-m", "pipeplan", "plan", "--model", "zoo:vgg16", "--cluster", "drlpp-4gpu",
                          "--planner", "drl-pp", "-O", f"checkpoint={path}"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONWARNINGS": "default"})
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "not a pipeplan checkpoint" in run.stderr, run.stderr
