"""Writing benchmark results that say where they came from.

Every file under ``benchmarks/results/`` is written through this module, which stamps it
with the command that reproduces it (as ``make bench`` runs it), the commit (and whether
the tree had uncommitted changes), the machine and the date — JSON under a
``"provenance"`` key, Markdown in a first paragraph, PNG in its text metadata — and writes
atomically (temporary file, then rename). ``check_provenance.py`` checks every file.

    from _results import write_json, write_markdown, save_figure   # scripts in benchmarks/
    write_json("spp/gap.json", data)                               # relative to results/
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def command() -> str:
    """The command line that reproduces this run, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        rel = script.relative_to(ROOT)
    except ValueError:
        rel = script
    return " ".join([".venv/bin/python", str(rel), *sys.argv[1:]])


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy

    versions = [f"Python {platform.python_version()}", f"numpy {numpy.__version__}"]
    try:
        import torch

        versions.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; " + ", ".join(versions)


def provenance() -> dict:
    dirty = bool(_git("status", "--porcelain", "--", "src", "benchmarks/*.py", "benchmarks/*/*.py"))
    return {"command": command(), "commit": _git("rev-parse", "HEAD"), "dirty": dirty, "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _target(rel: str | Path, out: Path | None) -> Path:
    """``rel`` under ``out`` (default benchmarks/results/); an absolute path as it is."""
    return Path(rel) if Path(rel).is_absolute() else (out or RESULTS) / rel


def write_json(rel: str | Path, data: dict, out: Path | None = None) -> Path:
    body = {"provenance": provenance(), **data}
    return _atomic(_target(rel, out), lambda p: Path(p).write_text(json.dumps(body, indent=1, default=str) + "\n"))


def markdown_stamp() -> str:
    p = provenance()
    dirty = " (with uncommitted changes)" if p["dirty"] else ""
    return (f"_Written by `{p['command']}` at commit `{p['commit'][:12]}`{dirty} on {p['machine']}, "
            f"{p['date']}. Do not edit: re-run the command (`make bench` runs them all)._\n\n")


def write_markdown(rel: str | Path, text: str, out: Path | None = None) -> Path:
    return _atomic(_target(rel, out), lambda p: Path(p).write_text(markdown_stamp() + text))


def save_figure(fig: Any, rel: str | Path, out: Path | None = None, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG, its provenance in the PNG's text metadata."""
    meta = {"Description": json.dumps(provenance())}
    return _atomic(_target(rel, out), lambda p: fig.savefig(p, dpi=dpi, metadata=meta, format="png"))
