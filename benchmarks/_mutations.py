"""What the mutation benchmarks share (``learning_mutations.py``, ``llm_mutations.py``): a
copy of ``src/`` with one edit applied, and the quick tests of a list of files run against it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import ROOT


def apply(edits: dict[str, tuple[str, str, str]], name: str, src: Path, script: str) -> None:
    """Mutation ``name`` of ``edits`` (file under src/, text, replacement) applied to the copy ``src``."""
    rel, old, new = edits[name]
    path = src / rel
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"mutation {name!r}: {old!r} is no longer in {rel}: update {script}")
    path.write_text(text.replace(old, new, 1))


def run_tests(src: Path, tests: list[str]) -> tuple[bool, list[str]]:
    """(every quick test of ``tests`` passed, the failing tests) against the source copy ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", "-x",
                           *tests], cwd=ROOT, env=env, capture_output=True, text=True)
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.M)
    return done.returncode == 0, failed


def run_all(names: list[str], mutate, tests: list[str], what: str, width: int = 18) -> dict[str, dict]:
    """The control (unmutated, the tests pass), then each mutation on a fresh copy of src/:
    name -> {caught, failing}, a line printed each."""
    passed, failed = run_tests(ROOT / "src", tests)
    if not passed:
        raise SystemExit(f"the {what} tests fail without a mutation: {', '.join(failed)}")
    rows = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "src"
            shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
            mutate(name, src)
            passed, failed = run_tests(src, tests)
        rows[name] = {"caught": not passed, "failing": failed}
        print(f"{name:<{width}} {'caught by ' + ', '.join(failed) if not passed else 'SURVIVES'}", flush=True)
    return rows
