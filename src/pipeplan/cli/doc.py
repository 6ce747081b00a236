"""``docs/cli.md``, generated from the code so that it cannot drift: every subcommand and
option (from the argument parser), planner and its ``-O`` options, schedule, cluster preset
and device kind. ``python -m pipeplan.cli.doc > docs/cli.md`` rewrites it; a test checks it
is current."""

from __future__ import annotations

import argparse

from .app import build_parser
from ..cluster import KINDS, PRESETS
from ..cluster.presets import SIZED_PRESETS
from ..planners.base import planner_catalog
from ..schedule.generators import SCHEDULES
from ..units import fmt_bytes


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _options(sp: argparse.ArgumentParser) -> list[str]:
    out = ["| option | meaning | default |", "|---|---|---|"]
    for a in sp._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        names = ", ".join(a.option_strings) or a.dest
        if a.metavar and a.option_strings:
            names += f" {a.metavar}"
        elif a.choices and not isinstance(a.choices, dict):
            names += " {" + ",".join(map(str, a.choices)) + "}"
        default = "" if a.default in (None, False, argparse.SUPPRESS) else f"`{a.default}`"
        out.append(f"| `{_cell(names)}` | {_cell(a.help or '')} | {default} |")
    return out


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = ["## Commands", ""]
    for name, sp in sub.choices.items():
        out += [f"### `pipeplan {name}`", "", _cell(helps.get(name, "")), "", *_options(sp), ""]
    return out


def _planners() -> list[str]:
    out = ["## Planners (`--planner NAME`, `-O KEY=VALUE`)", "",
           "In `compare`, `-O KEY=VALUE` goes to every compared planner that has the option (an error if "
           "none has it) and `-O NAME.KEY=VALUE` to one planner. A key given twice to one planner "
           "(`-O tp=1 -O tp=2`, or `-O tp=1 -O megatron.tp=2`) is refused in one line, never silently the last. "
           "`--schedule` is honored or refused: a planner whose plan would run another schedule exits 2.", "",
           "| planner | description | default schedule | options |", "|---|---|---|---|"]
    for e in planner_catalog():
        opts = "; ".join(f"`{o['name']}` ({o['type']}{', ' + o['range'] if 'range' in o else ''}, default "
                         f"{o['default']}{', one of ' + '/'.join(o['choices']) if 'choices' in o else ''}): "
                         f"{o['help']}" for o in e["options"]) or "-"
        out.append(f"| `{e['name']}` | {_cell(e['description'])} | `{e['default_schedule']}` | {_cell(opts)} |")
    return out + [""]


def _schedules() -> list[str]:
    out = ["## Schedules (`--schedule NAME`)", "", "| schedule | what it is |", "|---|---|"]
    out += [f"| `{n}` | {_cell(k.description)} |" for n, k in SCHEDULES.items()]
    return out + [""]


def _clusters() -> list[str]:
    out = ["## Cluster presets (`--cluster NAME`)", "",
           "Also `hier:servers=N,gpus=G,intra=BW,inter=BW[,kind=K][,latency=T][,memory=B][,speed=X]` and YAML "
           "or JSON files (docs/formats.md); bandwidths, sizes and times given as text need their unit.", "",
           "| preset | description |", "|---|---|"]
    out += [f"| `{n}` | {_cell(desc)} |" for n, (desc, _) in PRESETS.items()]
    out += [f"| `{n}` | {_cell(desc)} |" for n, (_, desc) in SIZED_PRESETS.items()]
    out += ["", "## Device kinds (`kind:` in a cluster file)", "",
            "| kind | memory | speed (V100 = 1) | resources | note |", "|---|---|---|---|---|"]
    for k in KINDS.values():
        res = ", ".join(r.name for r in k.resources) or "-"
        out.append(f"| `{k.name}` | {fmt_bytes(k.memory)} | {k.speed:.3g} | {res} | {_cell(k.note)} |")
    return out + [""]


def cli_reference() -> str:
    """The whole of docs/cli.md."""
    head = ["# pipeplan command-line reference", "",
            "Generated from the code by `python -m pipeplan.cli.doc > docs/cli.md`; do not edit by hand "
            "(`tests/test_clidoc.py` fails when it is out of date). `pipeplan --version` prints the "
            "installed version.", ""]
    return "\n".join(head + _commands() + _planners() + _schedules() + _clusters())


if __name__ == "__main__":
    print(cli_reference(), end="")
