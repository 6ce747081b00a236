"""Hostile models given to every command that loads one: one line ``pipeplan: error: ...``,
exit code 2, no traceback, no output file, no hang, nothing built beyond the limits.

The cases are generated: every size setting of each ``hf:`` architecture with each kind of
bad value, every user-code failure (import, factory, forward) under each command that runs
a model, and special files where a graph file is expected."""

from __future__ import annotations

from urllib.parse import parse_qsl

import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeplan.cli import main
from pipeplan.graph import save_graph
from pipeplan.graph.model import Graph

MODEL_COMMANDS = ("profile", "export", "run", "calibrate")

# -- hf: settings ------------------------------------------------------------------------------
#: each architecture's config keys by role (transformers' GPT2Config and BertConfig)
SHAPE = {"gpt2": {"layers": "n_layer", "width": "n_embd", "heads": "n_head", "vocab": "vocab_size",
                  "positions": "n_positions", "activation": "activation_function"},
         "bert": {"layers": "num_hidden_layers", "width": "hidden_size", "heads": "num_attention_heads",
                  "vocab": "vocab_size", "positions": "max_position_embeddings", "activation": "hidden_act"},
         "llama": {"layers": "num_hidden_layers", "width": "hidden_size", "heads": "num_attention_heads",
                   "vocab": "vocab_size", "positions": "max_position_embeddings", "activation": "hidden_act"}}
#: settings before the hostile one: a Llama's defaults are LlamaConfig's (7B), not a small model
BASE = {"gpt2": "", "bert": "",
        "llama": ("hidden_size=128&num_attention_heads=4&num_key_value_heads=2&intermediate_size=256&"
                  "num_hidden_layers=2&vocab_size=1000&max_position_embeddings=256&")}
BAD_SIZES = {"0": "must be a positive integer", "-1": "must be a positive integer",
             "abc": "must be int", "1.5": "must be int"}


def _merged(arch: str, extra: str) -> str:
    """``hf:ARCH?`` with the base settings, ``extra``'s keys replacing theirs (a key given
    twice is itself refused)."""
    query = dict(parse_qsl(BASE[arch]))
    query.update(parse_qsl(extra, keep_blank_values=True))
    return f"hf:{arch}?" + "&".join(f"{k}={v}" for k, v in query.items())


def _hf_cases() -> list[tuple[str, str]]:
    cases = []
    for arch, keys in SHAPE.items():
        def hf(extra: str, arch=arch) -> str:
            return _merged(arch, extra)
        for role in ("layers", "width", "heads", "vocab", "positions"):
            cases += [(hf(f"{keys[role]}={bad}"), f"{keys[role]}.*{why}") for bad, why in BAD_SIZES.items()]
        cases += [(hf(f"{keys['activation']}=nope"), f"unknown {keys['activation']} 'nope'"),
                  (hf("seq=257"), "seq=257 is beyond the model's 256 positions"),
                  (hf(f"{keys['layers']}=30000"), "30,003 layers; pipeplan plans for at most"),
                  (hf(f"{keys['layers']}=500&{keys['width']}=2048"), "parameters; pipeplan builds models of at most"),
                  (hf(f"{keys['width']}=130"), "is not a multiple of"),
                  (hf("microbatch=100000000&seq=256"), "one microbatch of input is")]
    cases += [(_merged("llama", f"num_key_value_heads={bad}"), "num_key_value_heads must be a positive integer "
               "dividing") for bad in ("0", "3", "-2")]
    cases.append((f"hf:llama?{BASE['llama']}&vocab_size=7", "key 'vocab_size' is given twice"))
    return cases


# -- user code: module source, factory name, what the error says ----------------------------
USER_MODULES = {
    "raises_at_import": ("raise RuntimeError('broken at import')\n", "f",
                         "importing .* failed \\(RuntimeError: broken at import\\)"),
    "syntax_error": ("def f(:\n", "f", "importing .* failed \\(SyntaxError"),
    "exits_at_import": ("import sys\nsys.exit(0)\n", "f", "importing .* failed \\(it called sys.exit\\(0\\)\\)"),
    "factory_raises": ("def f():\n    raise ValueError('no model today')\n", "f",
                       "the factory failed \\(ValueError: no model today\\)"),
    "factory_exits": ("import sys\ndef f():\n    sys.exit(3)\n", "f", "the factory failed \\(it called sys.exit\\(3\\)\\)"),
    "factory_zero_d": ("import torch\ndef f():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.tensor(1.0)\n",
                       "f", "batch dimension of at least one sample \\(got shape \\(\\)\\)"),
    "factory_not_a_pair": ("def f():\n    return 42\n", "f", "the factory failed \\(TypeError"),
    "forward_exits": (textwrap.dedent("""\
        import sys
        import torch

        class Exits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = torch.nn.Linear(4, 4)

            def forward(self, x):
                sys.exit(0)

        def f():
            return Exits(), torch.randn(2, 4)
        """), "f", "failed \\(it called sys.exit\\(0\\)\\)"),
}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A directory on sys.path holding the hostile user modules (``hostile_<name>``)."""
    d = tmp_path_factory.mktemp("user_models")
    for name, (source, _, _) in USER_MODULES.items():
        (d / f"hostile_{name}.py").write_text(source)
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))
    for name in USER_MODULES:
        sys.modules.pop(f"hostile_{name}", None)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """A plan for ``run`` to start from (the model is refused before it matters)."""
    d = tmp_path_factory.mktemp("plan")
    save_graph(Graph.chain("two", [1e-3, 1e-3], [2e-3, 2e-3], params=[4096, 4096], act=[1024, 1024]),
               d / "g.json")
    assert main(["plan", "--model", str(d / "g.json"), "--cluster", "v100x4", "--planner", "gpipe",
                 "--microbatches", "2", "--out", str(d / "p.json")]) == 0
    return d / "p.json"


def _out(tmp_path: Path, command: str) -> Path:
    """Where the command is asked to write (calibrate writes a cluster YAML)."""
    return tmp_path / ("out.yaml" if command == "calibrate" else "out.json")


def _argv(command: str, spec: str, out: Path, plan: Path, *extra: str) -> list[str]:
    if command == "run":
        return ["run", str(plan), "--model", spec, "--steps", "1", *extra]
    if command == "calibrate":
        return ["calibrate", "--model", spec, "--workers", "1", "--seconds", "0.01", "--no-runtime",
                "--out", str(out), *extra]
    return [command, spec, "--out", str(out), *extra]


def _refused(capsys, argv: list[str], message: str, out: Path) -> None:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and lines[0].startswith("pipeplan: error: "), captured.err
    assert "Traceback" not in captured.err and not captured.out
    assert re.search(message, lines[0]), (message, lines[0])
    assert not out.exists()


@pytest.mark.parametrize("command", MODEL_COMMANDS)
@pytest.mark.parametrize("spec, message", _hf_cases())
def test_hf_settings_are_checked_before_building(capsys, tmp_path, plan_file, command, spec, message):
    pytest.importorskip("transformers")
    out = _out(tmp_path, command)
    _refused(capsys, _argv(command, spec, out, plan_file), message, out)


@pytest.mark.parametrize("command", MODEL_COMMANDS)
@pytest.mark.parametrize("name", list(USER_MODULES))
def test_user_code_failures_are_one_line(capsys, tmp_path, user_dir, plan_file, command, name):
    _, factory, message = USER_MODULES[name]
    out = _out(tmp_path, command)
    _refused(capsys, _argv(command, f"hostile_{name}:{factory}", out, plan_file), message, out)


@pytest.mark.parametrize("command", ("profile", "export"))
def test_huge_microbatch_is_refused_before_allocating(capsys, tmp_path, plan_file, command):
    _refused(capsys, _argv(command, "example:mlp", tmp_path / "out.json", plan_file, "--microbatch", "2000000000"),
             "one microbatch of input is .* bytes; at most", tmp_path / "out.json")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("command", ("plan", "compare"))
@pytest.mark.parametrize("kind, message", [("fifo", "is a FIFO, not a regular file"),
                                           ("zero", "is a character device, not a regular file")])
def test_special_files_as_model_are_refused_before_reading(tmp_path, command, kind, message):
    """In a process of its own, with a time and memory limit: reading a FIFO blocks forever
    and /dev/zero never ends."""
    if kind == "fifo":
        path = tmp_path / "graph.json"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    r = subprocess.run([sys.executable, "-m", "pipeplan", command, "--model", str(path), "--cluster", "v100x4"],
                       capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory, env=env)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"pipeplan: error: model {str(path)!r}: {message}"]
