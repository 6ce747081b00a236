"""Check that every file under benchmarks/results/ says, truthfully, where it came from.

A file passes when it carries provenance (see _results.py), its command is one of the
commands of the Makefile's ``bench`` target, and its commit is in the history of HEAD.
Files written with uncommitted changes are listed as a note (``--strict``: as offenders).
Exits 1 listing the offenders, 0 when there are none.

    python benchmarks/check_provenance.py [--strict] [--results DIR] [--makefile FILE]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from _results import RESULTS, ROOT, SIDECAR, read_provenance

VARIABLE = re.compile(r"^([A-Za-z_]\w*)\s*(?::=|\?=|=)\s*(.*?)\s*$")
REFERENCE = re.compile(r"\$\((\w+)\)")


def _expand(text: str, variables: dict[str, str]) -> str:
    for _ in range(10):  # variables referring to variables
        text = REFERENCE.sub(lambda m: variables.get(m.group(1), ""), text)
    return text


def bench_commands(makefile: Path) -> set[str]:
    """The command lines of the Makefile's ``bench`` target, its variables expanded."""
    lines = makefile.read_text().splitlines()
    variables = {m.group(1): m.group(2) for m in map(VARIABLE.match, lines) if m}
    commands, in_bench = set(), False
    for line in lines:
        if in_bench and line.startswith("\t"):
            commands.add(" ".join(_expand(line, variables).split()))
        else:
            in_bench = line.startswith("bench:")
    return commands


def in_history(commit: str) -> bool:
    """Whether ``commit`` is HEAD or one of its ancestors."""
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit or ""):
        return False
    done = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def problems(path: Path, commands: set[str], strict: bool) -> list[str]:
    """What is wrong with one results file's provenance (empty: nothing)."""
    if path.name.endswith(SIDECAR):
        target = path.with_name(path.name[:-len(SIDECAR)])
        return [] if target.exists() else [f"provenance of a missing file, {target.name}"]
    stamp = read_provenance(path)
    if stamp is None:
        return ["no provenance"]
    out = []
    if " ".join(str(stamp.get("command", "")).split()) not in commands:
        out.append(f"command not in the Makefile's bench target: {stamp.get('command')!r}")
    if not in_history(str(stamp.get("commit", ""))):
        out.append(f"commit not in the history of HEAD: {stamp.get('commit')!r}")
    if strict and stamp.get("dirty"):
        out.append("written with uncommitted changes")
    return out


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strict", action="store_true", help="files written with uncommitted changes fail too")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder to check (default: benchmarks/results)")
    ap.add_argument("--makefile", type=Path, default=ROOT / "Makefile")
    args = ap.parse_args()
    commands = bench_commands(args.makefile)
    files = sorted(p for p in args.results.resolve().rglob("*") if p.is_file() and not p.name.startswith("."))
    bad = {path: found for path in files if (found := problems(path, commands, args.strict))}
    for path in files:
        if path not in bad and (read_provenance(path) or {}).get("dirty"):
            print(f"note: {_shown(path)}: written with uncommitted changes")
    for path, found in bad.items():
        print(f"{_shown(path)}: " + "; ".join(found))
    print(f"{len(files) - len(bad)} of {len(files)} results files have valid provenance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
