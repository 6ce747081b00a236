"""Hostile inputs for every subcommand, generated rather than listed: each option of each
command (read from the CLI's own parser) is given an empty value, out-of-range and
non-numeric numbers and a bogus choice; each file a command reads is given a missing file, a
directory, a FIFO, a device, an empty file, binary junk, the valid file cut short and the
valid file mutated (every value replaced by a string, a list, null, NaN, 1e308, -1 and a
400-digit integer; an unknown key added to every object; every list shortened); each file it
writes is given a directory, a FIFO, a device, a symbolic link and a wrong extension.

Whatever it is given, pipeplan answers with exit code 2 and one line ``pipeplan: error: ...``
(after warnings or notes where legitimate): no traceback, no warning noise, no hang, no file
left behind. A mutation that leaves a file valid may exit 0 instead, with an answer free of
NaN and infinity.

Commands run in-process. The work a runtime command starts once its inputs are read
(profiling, calibration, training, a run, a planner's search) is replaced by a tripwire:
reaching it with a hostile value means the value was accepted.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from pipeplan.cli import build_parser, main

from helpers import CLUSTER_DICT, GRAPH_DICT

from conftest import PROFILES

ERROR = re.compile(r"pipeplan(?: [\w-]+)?: error: ")
REMARK = re.compile(r"pipeplan: (?:warning|note): ")

GRAPH, CLUSTER = GRAPH_DICT, CLUSTER_DICT

#: A cheap valid invocation of each command; {name} stands for a valid input file or, for
#: {out}, a new file in the case's folder.
BASE = {
    "plan": ["plan", "--model", "{graph}", "--cluster", "{cluster}", "--planner", "gpipe", "--microbatches", "2"],
    "compare": ["compare", "--model", "{graph}", "--cluster", "{cluster}", "--planners", "gpipe,dp",
                "--microbatches", "2"],
    "simulate": ["simulate", "{plan}"],
    "export-plan": ["export-plan", "{plan}", "--to", "megatron"],
    "explain": ["explain", "{plan}"],
    "report": ["report", "{plan}", "--html", "{html}"],
    "profile": ["profile", "example:mlp"],
    "export": ["export", "example:mlp", "--out", "{out}"],
    "calibrate": ["calibrate", "--workers", "1", "--no-runtime"],
    "run": ["run", "{plan}", "--model", "example:mlp"],
    "train": ["train", "drl-pp", "--model", "{graph}", "--cluster", "{cluster}", "--evaluations", "10"],
    "shard": ["shard", "--model", "bert-tiny", "--devices", "2"],
    "dynamic": ["dynamic", "bench"],
    "planners": ["planners"],
    "models": ["models"],
    "clusters": ["clusters"],
}
#: What each command starts once its inputs are read (replaced by a tripwire).
WORK = {
    "profile": ["pipeplan.runtime.profiler.load_model"],
    "export": ["pipeplan.runtime.aten_graph.export_program"],
    "calibrate": ["pipeplan.runtime.calibrate.calibrate"],
    "run": ["pipeplan.runtime.executor.run_plan"],
    "train": ["pipeplan.planners.drlpp.run.train_agent", "pipeplan.planners.automap.infer.train"],
    "shard": ["pipeplan.sharding.shard.shard"],
    "dynamic": ["pipeplan.dynamic.experiment.build"],
}
#: Input files by option destination and the valid file each one takes ({model} only where
#: it names a graph; elsewhere it names Python code).
INPUTS = {"plan": "plan", "cluster": "cluster", "init": None, "checkpoint": None, "measured": "graph",
          "schedule_csv": None}
GRAPH_MODEL_COMMANDS = ("plan", "compare", "train")
OUTPUTS = ("out", "trace", "gantt", "html")
#: Bases for options that only one form of a command takes.
OPTION_BASE = {("dynamic", "checkpoint"): ["dynamic", "eval"]}
#: Values that are valid for the option they are given to.
LEGIT = {("--warmup", "0"), ("--seed", "0")}
NUMBERS = ["-1", "0", "nan", "inf", "1e308", str(10**20)]
#: What is not a readable file of any format: name in the case's folder, how to make it.
PLAIN_FILES = {"missing (a newline in its name)": ("no\nsuch.json", None), "directory": ("dir.json", "dir"),
               "FIFO": ("fifo.json", "fifo"), "empty file": ("empty.json", b""),
               "binary junk": ("junk.json", bytes(range(256)) * 8)}
#: Cases that fail in code other engineers own (runtime launchers' options, checkpoints,
#: shard): expected to fail until it is fixed there.
OWNED_ELSEWHERE: set[str] = set()  # cases another part of the code base must still fix


@dataclass(frozen=True)
class Case:
    """One hostile invocation: ``argv`` with {placeholders}; ``files``: name -> how to make it
    in the case's folder; ``strict``: exit code 2 required (else 0 is allowed too)."""

    id: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, object], ...] = ()
    strict: bool = True
    bulk: bool = False  # one of many alike (mutations, cuts): most run with the slow tests only
    planner_runs: bool = False  # the planner reads the hostile value itself (no tripwire on it)


class ReachedWork(Exception):
    """A command got past its input checks with a hostile value."""


# -- generating the cases ------------------------------------------------------------------------

def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


COMMANDS = _commands()


def _value_actions(sp: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options that take a value (flags, --help and -O aside)."""
    return [a for a in sp._actions if a.option_strings and a.nargs != 0 and a.dest != "planner_option"]


def _is_numeric(a: argparse.Action) -> bool:
    typed = a.type in (int, float) or getattr(a.type, "__name__", "") in ("positive_int", "non_negative_int",
                                                                          "threads", "seed")
    return typed or a.dest in ("memory_limit", "budget")


def _with(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option`` set to ``value`` (replaced where the base gives it)."""
    out = list(argv)
    if option in out:
        out[out.index(option) + 1] = value
        return out
    return out + [f"{option}={value}"]


def _input_kind(command: str, dest: str) -> str | None:
    """The valid file an input option takes, 'any' for one with no valid file here, None if
    the option reads no file."""
    if dest == "model":
        return "graph" if command in GRAPH_MODEL_COMMANDS else None
    if dest not in INPUTS:
        return None
    return INPUTS[dest] or "any"


def option_cases() -> list[Case]:
    cases = []
    for command, sp in COMMANDS.items():
        base = BASE[command]
        cases.append(Case(f"{command} --no-such-option", (*base, "--no-such-option")))
        for a in _value_actions(sp):
            opt = a.option_strings[-1]
            cases.append(Case(f"{command} {opt} empty", tuple(_with(base, opt, ""))))
            if _is_numeric(a):
                cases += [Case(f"{command} {opt} {v}", tuple(_with(base, opt, v))) for v in NUMBERS
                          if (opt, v) not in LEGIT]
            if a.choices:
                cases.append(Case(f"{command} {opt} bogus", tuple(_with(base, opt, "bogus"))))
            if getattr(a.type, "__name__", "") == "names":
                cases += [Case(f"{command} {opt} list {v!r}", tuple(_with(base, opt, v))) for v in ("gpipe,", ",", " , ")]
            if a.dest == "threads":
                cases.append(Case(f"{command} {opt} 100000", tuple(_with(base, opt, "100000"))))
            if a.dest in OUTPUTS:
                cases += output_cases(command, opt, base)
            kind = _input_kind(command, a.dest)
            if kind:
                own = OPTION_BASE.get((command, a.dest), base)
                cases += input_cases(f"{command} {opt}", lambda p, o=opt, b=own: _with(b, o, p), kind,
                                     contents=command == "plan")
        if any(not a.option_strings and a.dest == "plan" for a in sp._actions):
            at = base.index("{plan}")
            cases += input_cases(f"{command} PLAN", lambda p, b=base, i=at: b[:i] + [p] + b[i + 1:], "plan",
                                 contents=command == "simulate")
    cases += input_cases("explain PLAN_B", lambda p: ["explain", "{plan}", p], "plan", contents=False)
    cases += input_cases("report --compare", lambda p: [*BASE["report"], "--compare", p], "plan", contents=False)
    return cases + planner_option_cases() + schedule_cases() + llm_cases()


#: A decoder LLM run the LLM cases vary (a small GPT on one DGX A100)
LLM_GPT = "hidden=256&layers=2&heads=4&seq=128&vocab=512"
LLM_HF = ("hidden_size=256&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2&intermediate_size=512"
          "&vocab_size=512&seq=128")
BAD_SIZES = ("0", "-1", "x", "1000000000", "9" * 20)


def _llm_plan(model: str, *extra: str, planner: str = "megatron") -> tuple[str, ...]:
    return ("plan", "--model", model, "--cluster", "dgx-a100x1", "--planner", planner, "--global-batch", "8", *extra)


def _query(base: str, key: str, value: str) -> str:
    """``base`` with ``key`` set to ``value`` (replaced where ``base`` has it)."""
    pairs = [p for p in base.split("&") if p and p.split("=")[0] != key]
    return "&".join(pairs + [f"{key}={value}"])


def llm_cases() -> list[Case]:
    """Generated from the LLM specs' and pins' own declarations, so that a new option joins:
    every ``zoo:`` decoder key given absurd sizes, twice, and an unknown key; ``hf:`` configs
    short of each dimension pipeplan reads, with a key their config lacks, a key twice, a file
    without dimensions; every decoder pin of megatron and joint given values it cannot hold;
    schedules decoders do not run and ``--schedule`` against ``-O schedules``."""
    from dataclasses import fields

    from pipeplan.graph.hf_config import NEEDED
    from pipeplan.graph.llm import DESCRIPTIONS, GPT_OPTIONS, PRESET_OPTIONS
    from pipeplan.planners.llm3d import LLMOptions

    cases = []
    for name in DESCRIPTIONS:
        base = LLM_GPT if name == "gpt" else ""
        for key in GPT_OPTIONS if name == "gpt" else PRESET_OPTIONS:
            cases += [Case(f"zoo:{name} {key}={v}", _llm_plan(f"zoo:{name}?{_query(base, key, v)}"), bulk=True)
                      for v in BAD_SIZES]
            cases.append(Case(f"zoo:{name} {key} twice", _llm_plan(f"zoo:{name}?{_query(base, key, '2')}&{key}=3")))
        cases.append(Case(f"zoo:{name} unknown key", _llm_plan(f"zoo:{name}?{_query(base, 'bogus', '1')}")))
    for key in NEEDED["llama"]:
        short = "&".join(p for p in LLM_HF.split("&") if p.split("=")[0] != key)
        cases.append(Case(f"hf:llama without {key}", _llm_plan(f"hf:llama?{short}")))
        cases += [Case(f"hf:llama {key}={v}", _llm_plan(f"hf:llama?{_query(LLM_HF, key, v)}"), bulk=True)
                  for v in BAD_SIZES]
    cases += [Case("hf:llama unknown key", _llm_plan(f"hf:llama?{LLM_HF}&bogus_key=3")),
              Case("hf:llama a key twice", _llm_plan(f"hf:llama?{LLM_HF}&vocab_size=7")),
              Case("hf:llama seq absurd", _llm_plan(f"hf:llama?{_query(LLM_HF, 'seq', '1000000000')}")),
              Case("hf: config.json without dimensions", _llm_plan("hf:{dir}/config.json"),
                   files=(("config.json", ("text", '{"model_type": "llama"}')),))]
    return cases + llm_pin_cases(fields(LLMOptions))


def llm_pin_cases(pins) -> list[Case]:
    """Each decoder pin of megatron and joint, given values that cannot hold on the small GPT
    (refused by the planner itself: it runs), given twice, and the schedules cases."""
    model = f"zoo:gpt?{LLM_GPT}"
    bad = {"int": ("0", "1000000", "x"), "bool": ("maybe",), "str": ("bogus",)}
    cases = []
    for planner in ("megatron", "joint"):
        for f in pins:
            kind = "str" if "str" in str(f.type) else "bool" if "bool" in str(f.type) else "int"
            values = {"zero": ("2", "x"), "layout": ("0,0", "3*0", "1*3", "x")}.get(f.name, bad[kind])
            cases += [Case(f"plan {model} --planner {planner} -O {f.name}={v}",
                           _llm_plan(model, "-O", f"{f.name}={v}", planner=planner), planner_runs=True, bulk=True)
                      for v in values]
        cases.append(Case(f"plan {model} --planner {planner} -O tp twice",
                          _llm_plan(model, "-O", "tp=1", "-O", "tp=2", planner=planner)))
    for schedules in ("gpipe", "1f1b,bogus", ","):
        cases.append(Case(f"plan {model} --planner joint -O schedules={schedules}",
                          _llm_plan(model, "-O", f"schedules={schedules}", planner="joint"), planner_runs=True))
    cases.append(Case(f"plan {model} --planner joint --schedule 1f1b -O schedules=zb-h1",
                      _llm_plan(model, "--schedule", "1f1b", "-O", "schedules=zb-h1", planner="joint"),
                      planner_runs=True))
    return cases


def schedule_cases() -> list[Case]:
    """A schedule DRL-PP cannot choose (its actions hold the synchronous flushes and
    PipeDream's asynchronous pipeline), given to the planner and to its training."""
    plan = _with(_with(BASE["plan"], "--planner", "drl-pp"), "--schedule", "zb-v")
    return [Case("plan --planner drl-pp --schedule zb-v", tuple(plan), planner_runs=True),
            Case("train --schedule zb-v", tuple(_with(BASE["train"], "--schedule", "zb-v")), planner_runs=True)]


def planner_option_cases() -> list[Case]:
    """Every planner's -O options given an empty value and values of the wrong kind (and
    seeds out of range), through ``plan --planner NAME``."""
    from pipeplan.planners.base import planner_catalog

    cases = []
    for entry in planner_catalog():
        base = _with(BASE["plan"], "--planner", entry["name"])
        for o in entry["options"]:
            values = [""] + (["banana"] if o["type"].split(" ")[0] != "str" or "choices" in o else [])
            if o["type"].split(" ")[0] in ("int", "float"):
                values += ["nan", "inf"] + (["-1", str(10**20)] if o["name"] == "seed" else [])
            cases += [Case(f"plan --planner {entry['name']} -O {o['name']}={v or 'empty'}",
                           (*base, "-O", f"{o['name']}={v}")) for v in values]
            if o["name"] == "checkpoint":
                cases += [replace(c, planner_runs=True) for c in input_cases(
                    f"plan --planner {entry['name']} -O checkpoint=", lambda p, b=base: [*b, "-O", f"checkpoint={p}"],
                    "any", contents=False)]
    return cases


def output_cases(command: str, opt: str, base: list[str]) -> list[Case]:
    ext = {"train": ".pt", "dynamic": ".pt", "calibrate": ".yaml", "report": ".html"}.get(
        command, ".png" if opt == "--gantt" else ".json")
    targets = {"directory": ("dir" + ext, "dir"), "FIFO": ("fifo" + ext, "fifo"), "symlink": ("link" + ext, "link"),
               "wrong extension": ("out.txt", None), "file as folder": ("file/out" + ext, "file")}
    cases = [Case(f"{command} {opt} {what}", tuple(_with(base, opt, "{dir}/" + name)),
                  files=((name.split("/")[0], make),) if make else ())
             for what, (name, make) in targets.items()]
    cases.append(Case(f"{command} {opt} device", tuple(_with(base, opt, "/dev/null"))))
    return cases


def input_cases(label: str, put, kind: str, contents: bool) -> list[Case]:
    """A reader's hostile files: what is not a file, what is not its format, and (for the
    formats pipeplan writes) its valid file cut short and mutated."""
    cases = [Case(f"{label} {what}", tuple(put("{dir}/" + name)), files=((name, make),) if make else ())
             for what, (name, make) in PLAIN_FILES.items()]
    cases.append(Case(f"{label} /dev/zero", tuple(put("/dev/zero"))))
    if contents and kind in ("graph", "plan", "cluster"):
        cases += content_cases(label, put, kind)
    return cases


def content_cases(label: str, put, kind: str) -> list[Case]:
    """The valid ``kind`` file cut short and mutated."""
    name = {"graph": "g.json", "plan": "p.json", "cluster": "c.yaml"}[kind]
    cases = [Case(f"{label} cut at {frac}", tuple(put("{dir}/" + name)), files=((name, ("cut", kind, frac)),),
                  strict=kind != "cluster") for frac in (0.3, 0.5, 0.7)]
    for mid, spec, strict in mutations(kind):
        cases.append(Case(f"{label} {mid}", tuple(put("{dir}/" + name)), files=((name, ("mutant", kind, spec)),),
                          strict=strict, bulk=True))
    if kind == "cluster":
        cases += [Case(f"{label} {what}", tuple(put("{dir}/c.yaml")), files=(("c.yaml", ("text", text)),))
                  for what, text in YAML_SPECIALS.items()]
    if kind == "graph" and (PROFILES / "alexnet" / "graph.txt").is_file():
        lines = len((PROFILES / "alexnet" / "graph.txt").read_text().split("\n"))
        cases += [Case(f"{label} graph.txt cut after line {k}", tuple(put("{dir}/graph.txt")),
                       files=(("graph.txt", ("txt lines", k)),), bulk=True) for k in range(2, lines)]
    return cases


def _bomb(levels: int = 9) -> str:
    """A "billion laughs": 9^levels strings from a few hundred bytes, as the cluster's name
    (which a reader turns into text) and devices."""
    lines = ["x0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return f"name: {{{', '.join(lines)}}}\ndevices: *a{levels - 1}\nbandwidth: 10GB/s\n"


#: Cluster YAML that no mutation of a valid file makes.
YAML_SPECIALS = {
    "a mapping as a key": "devices: [{name: a}, {name: b}]\nbandwidth: 10GB/s\n? {x: 1}\n: 2\n",
    "a list as a key": "devices: [{name: a}, {name: b}]\nbandwidth: 10GB/s\n? [1, 2]\n: 2\n",
    "an alias bomb": _bomb(),
    "a recursive alias": "devices: &d [{name: a}, *d]\nbandwidth: 10GB/s\n",
    "NaN bandwidth": "devices: [{name: a}, {name: b}]\nbandwidth: .nan\n",
    "NaN link": "devices: [{name: a}, {name: b}]\nbandwidth: 10GB/s\nlinks: [{from: a, to: b, bandwidth: .nan}]\n",
    "a link matrix of the wrong shape": ("devices: [{name: a, memory: 1GB, speed: 1}, {name: b, memory: 1GB, speed: 1}]"
                                         "\nbandwidth_matrix: [[0, 1e9]]\nlatency_matrix: [[0, 0], [0, 0]]\n"),
    "a full cluster with no devices": "devices: []\nbandwidth_matrix: []\nlatency_matrix: []\n",
    "a negative self bandwidth by server": ("devices: [{name: a, memory: 1e9, speed: 1, server: s0}, {name: b, memory: "
                                            "1e9, speed: 1, server: s0}]\nserver_links: {bandwidth: [[1e9]], latency: [[0]], "
                                            "self_bandwidth: -1, self_latency: 0}\n"),
    "a negative bandwidth on the diagonal": ("devices: [{name: a, memory: 1e9, speed: 1}, {name: b, memory: 1e9, speed: 1}]"
                                             "\nbandwidth_matrix: [[-1, 1e9], [1e9, 0]]\nlatency_matrix: [[0, 0], [0, 0]]\n"),
    "no devices": "devices: []\nbandwidth: 10GB/s\n",
    "a 5000-digit bandwidth": "devices: [{name: a}, {name: b}]\nbandwidth: " + "9" * 5000 + "\n",
}
MUTANTS = {"string": "x", "list": [1], "null": None, "nan": math.nan, "1e308": 1e308, "-1": -1,
           "400-digit integer": 10**400}


def _paths(doc, prefix: tuple = ()) -> list[tuple]:
    """Every value's path in ``doc`` (keys and indices), containers included."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        out += _paths(v, prefix + (k,))
    return out


def _at(doc, path: tuple):
    for step in path:
        doc = doc[step]
    return doc


def _recomputed(path: tuple) -> bool:
    """A plan's prediction (and iteration time) are recomputed, not read: only the
    prediction's type is checked."""
    return path[0] == "iteration_s" or (path[0] == "prediction" and len(path) > 1)


def _must_refuse(old, mutant: str) -> bool:
    """A number replaced by a non-number, NaN or a 400-digit integer; an object or a list
    replaced by a scalar (an object by a list too)."""
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        return mutant in ("string", "list", "nan", "400-digit integer")
    if isinstance(old, (dict, list)):
        return mutant not in ("null", "list") or isinstance(old, dict) and mutant == "list"
    return False


def mutations(kind: str) -> list[tuple[str, tuple, bool]]:
    """(id, spec, strict) of every mutation of the valid ``kind`` document: a value replaced,
    an unknown key added, a list shortened or emptied. Strict (exit 2 required): ``_must_refuse``, and
    an unknown key in a graph or cluster."""
    doc = _valid_doc(kind)
    out = []
    for path in _paths(doc):
        old = _at(doc, path)
        where = ".".join(map(str, path))
        for name in MUTANTS:
            strict = _must_refuse(old, name) and not _recomputed(path)
            out.append((f"{where} = {name}", ("set", path, name), strict))
        if isinstance(old, list) and old:
            out += [(f"{where} shortened", ("shorten", path), False), (f"{where} emptied", ("empty", path), False)]
    for path in [()] + _paths(doc):
        if isinstance(_at(doc, path), dict):
            # free-form: a graph's meta, a plan's planner sections, prediction and stages
            free = "meta" in path or (kind == "plan" and path[:1] not in (("graph",), ("cluster",)))
            out.append((f"{'.'.join(map(str, path)) or 'top'} + unknown key", ("extra", path), not free))
    return out


# -- making the files ---------------------------------------------------------------------------

_VALID: dict[str, object] = {}


def _valid_doc(kind: str):
    if kind not in _VALID:
        _VALID[kind] = {"graph": GRAPH, "cluster": CLUSTER, "plan": None}[kind]
        if kind == "plan":
            _VALID["plan"] = _make_plan()
    return copy.deepcopy(_VALID[kind])


def _make_plan() -> dict:
    import contextlib
    import io
    import tempfile

    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        (Path(d) / "g.json").write_text(json.dumps(GRAPH))
        (Path(d) / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
        argv = [a.format(graph=f"{d}/g.json", cluster=f"{d}/c.yaml") for a in BASE["plan"]]
        assert main(argv + ["--out", f"{d}/p.json"]) == 0
        return json.loads((Path(d) / "p.json").read_text())


def _mutant(kind: str, spec: tuple):
    doc = _valid_doc(kind)
    if spec[0] == "extra":
        _at(doc, spec[1])["unexpected_key"] = 1
    elif spec[0] == "shorten":
        _at(doc, spec[1]).pop()
    elif spec[0] == "empty":
        _at(doc, spec[1]).clear()
    else:
        path, name = spec[1], spec[2]
        _at(doc, path[:-1])[path[-1]] = copy.deepcopy(MUTANTS[name])
    return doc


def _dump(kind: str, doc) -> str:
    if kind == "cluster":
        return yaml.safe_dump(doc)
    return json.dumps(doc, allow_nan=True)


def make_file(folder: Path, name: str, how) -> None:
    path = folder / name
    if how == "dir":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "file":
        path.write_text("x")
    elif how == "link":
        (folder / "real").write_text("keep")
        path.symlink_to(folder / "real")
    elif isinstance(how, bytes):
        path.write_bytes(how)
    elif how[0] == "text":
        path.write_text(how[1])
    elif how[0] == "cut":
        text = _dump(how[1], _valid_doc(how[1]))
        path.write_text(text[: int(len(text) * how[2])])
    elif how[0] == "mutant":
        path.write_text(_dump(how[1], _mutant(how[1], how[2])))
    elif how[0] == "txt lines":
        lines = (PROFILES / "alexnet" / "graph.txt").read_text().split("\n")
        path.write_text("\n".join(lines[: how[1]]))


def valid_inputs(folder: Path) -> dict[str, str]:
    files = {"graph": ("g.json", json.dumps(GRAPH)), "cluster": ("c.yaml", yaml.safe_dump(CLUSTER)),
             "plan": ("p.json", json.dumps(_valid_doc("plan")))}
    out = {"dir": str(folder), "out": str(folder / "new.json"), "html": str(folder / "new.html")}
    for key, (name, text) in files.items():
        (folder / "valid").mkdir(exist_ok=True)
        (folder / "valid" / name).write_text(text)
        out[key] = str(folder / "valid" / name)
    return out


# -- running a case -----------------------------------------------------------------------------

class FifoWatch:
    """Unblocks a command stuck opening a FIFO of ``folder`` (opens its other end after
    ``after_s``) and records that it was stuck."""

    def __init__(self, folder: Path, after_s: float = 1.0) -> None:
        self.fifos = [p for p in folder.iterdir() if p.is_fifo()]
        self.stuck: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(after_s,), daemon=True)

    def _watch(self, after_s: float) -> None:
        while not self._done.wait(after_s):
            for f in self.fifos:
                try:
                    fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only if a reader waits
                except OSError:
                    continue
                self.stuck.append(f.name)
                os.close(fd)

    def __enter__(self) -> "FifoWatch":
        if self.fifos:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()


def _tripwire(*args, **kwargs):
    raise ReachedWork()


def _arm_tripwires(argv: list[str], planner_runs: bool, monkeypatch) -> None:
    """Replace the work of ``argv``'s command, and the search of a planner given -O options
    (unless ``planner_runs``)."""
    from pipeplan.planners.base import REGISTRY, get_planner

    for target in WORK.get(argv[0], []):
        monkeypatch.setattr(target, _tripwire)
    if "-O" in argv and "--planner" in argv and not planner_runs:
        name = argv[argv.index("--planner") + 1]
        monkeypatch.setitem(REGISTRY, name, replace(get_planner(name), fn=_tripwire))


def run_case(case: Case, folder: Path, monkeypatch, capsys) -> tuple[int | str, str, str, set[str]]:
    """(exit code or 'reached work', stdout, stderr, the folder's files before) of ``case``
    run in ``folder``."""
    for name, how in case.files:
        make_file(folder, name, how)
    values = valid_inputs(folder)
    before = set(os.listdir(folder))
    argv = [a.format(**values) if "{" in a else a for a in case.argv]
    _arm_tripwires(argv, case.planner_runs, monkeypatch)
    with FifoWatch(folder) as watch, warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            code: int | str = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except ReachedWork:
            code = "reached work"
    out, err = capsys.readouterr()
    assert not watch.stuck, f"blocked opening {watch.stuck}"
    return code, out, err, before


def check_answer(case: Case, code, out: str, err: str, before: set[str], folder: Path) -> None:
    assert code in ((2,) if case.strict else (0, 2)), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) >= 1 and ERROR.match(lines[-1]) and err.endswith("\n"), err
        assert all(REMARK.match(line) for line in lines[:-1]), err
        new = sorted(set(os.listdir(folder)) - before)
        assert not new, f"left behind: {new}"
    else:
        assert not re.search(r"\bnan\b|\binf\b", out.lower()), out


ALL = option_cases()
assert len({c.id for c in ALL}) == len(ALL), "case ids must be unique"
#: Cases the fast share always runs: one of each hostile input the project has met.
KEY_CASES = {
    "plan --model nodes.0.fwd_s = 400-digit integer", "plan --model nodes.0.fwd_s = 1e308",
    "plan --model nodes.0.fwd_s = string", "plan --model top + unknown key", "plan --model nodes.0 + unknown key",
    "plan --model graph.txt cut after line 10", "plan --model graph.txt cut after line 30",
    "plan --model missing (a newline in its name)", "plan --model FIFO", "plan --model /dev/zero",
    "plan --cluster a mapping as a key", "plan --cluster an alias bomb", "plan --cluster NaN link",
    "plan --cluster a link matrix of the wrong shape", "plan --cluster a full cluster with no devices",
    "simulate PLAN prediction = list", "simulate PLAN microbatches = string", "simulate PLAN search_s = string",
    "simulate PLAN cluster.devices emptied", "simulate PLAN cluster.server_links.bandwidth.0.0 = nan",
    "simulate PLAN cluster.server_links.bandwidth.0 shortened", "simulate PLAN FIFO",
    "plan --schedule empty", "compare --planners empty", "dynamic --devices empty", "compare --planners list 'gpipe,'",
    f"train --seed {10**20}", "dynamic --seed -1", f"plan --planner joint -O seed={10**20}",
    "plan --planner drl-pp -O checkpoint=empty", "profile --threads 100000", "dynamic --threads 100000",
    "plan --planner drl-pp --schedule zb-v", "train --schedule zb-v",
}
#: The fast share of the corpus (``-m "not slow"``): the key cases, every other of the rest
#: but the bulk, one in 15 of those.
FAST = KEY_CASES | {c.id for i, c in enumerate(ALL) if (not c.bulk and i % 2 == 0) or i % 15 == 0}


def _params(cases: list[Case]) -> list:
    out = []
    for c in cases:
        marks = [] if c.id in FAST else [pytest.mark.slow]
        if c.id in OWNED_ELSEWHERE:
            marks.append(pytest.mark.xfail(reason="owned elsewhere", strict=True))
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _params(ALL))
def test_hostile_input_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys):
    code, out, err, before = run_case(case, tmp_path, monkeypatch, capsys)
    check_answer(case, code, out, err, before, tmp_path)


def test_the_key_cases_are_in_the_corpus():
    """(The cuts of a PipeDream profile need ../shared's profiles; without them they are not
    generated, and not required.)"""
    shared = (PROFILES / "alexnet" / "graph.txt").is_file()
    assert {k for k in KEY_CASES if shared or "graph.txt cut" not in k} <= {c.id for c in ALL}


def test_every_command_has_a_valid_base(tmp_path, monkeypatch, capsys):
    """The corpus's bases are valid: each command runs (or reaches its work), so that its
    cases fail for the hostile value only."""
    assert set(BASE) == set(COMMANDS)
    for command in ("plan", "compare", "simulate", "explain", "report", "run", "profile", "train"):
        code, _, err, _ = run_case(Case(command, tuple(BASE[command])), tmp_path, monkeypatch, capsys)
        assert code in (0, "reached work"), (command, code, err)
