"""Benchmark results that say where they came from.

Every file under ``benchmarks/results/`` is written through this module. Each is stamped
with its provenance — ``command`` (the command line that reproduces it, as ``make bench``
runs it), ``commit`` (git HEAD) with ``dirty`` (uncommitted changes in src/ or
benchmarks/ outside results/), ``machine`` (CPU model, cores, OS, Python, numpy, torch;
no hostname) and ``date`` — and written atomically (a temporary file in the same folder,
then a rename). ``benchmarks/check_provenance.py`` checks every file.

Where the stamp goes:

- JSON: a ``"provenance"`` key first in the top-level object;
- Markdown: a front-matter block (``---`` lines) at the top, one ``key: <JSON value>`` a line;
- PNG: a ``provenance`` text chunk holding the JSON;
- CSV: a sibling ``<name>.provenance.json``.

Use from a script (``benchmarks/`` is not a package: scripts directly in it import this
module as is; scripts in a subfolder first put ``benchmarks/`` on ``sys.path``)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
    from _results import add_out_argument, save_figure, write_json, write_markdown

    add_out_argument(parser, "spp")                  # --out DIR, default benchmarks/results/spp
    write_json(args.out / "gap.json", {...})         # a relative path is under benchmarks/results/
    write_markdown(args.out / "gap.md", "# ...")     # the stamp is added above the text
    save_figure(fig, args.out / "gap.png")           # a matplotlib figure
    write_csv(args.out / "cells.csv", [{"a": 1}])    # rows of dicts, same keys
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import multiprocessing
import os
import platform
import shlex
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: PipeDream's profiles, read from ../shared beside the repository (never copied here)
PROFILES = ROOT.parent / "shared" / "profiles" / "pipedream"
#: The interpreter every command is recorded with: ``make bench``'s ``$(BIN)/python``.
PYTHON = ".venv/bin/python"
FRONT = "---"
PNG_KEY = "provenance"
SIDECAR = ".provenance.json"


def _normalize(token: str, cwd: Path) -> str:
    """A path argument as seen from the repository root; anything else as it is."""
    if token.startswith("-") or ":" in token or os.path.isabs(token):
        return token
    if not ((cwd / token).exists() or ("/" in token and (cwd / token).parent.exists())):
        return token
    path = Path(os.path.normpath(cwd / token))
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def command(argv: list[str] | None = None, cwd: Path | None = None) -> str:
    """The command line that reproduces this run, the same from whichever folder it ran.

    ``.venv/bin/python``, the script relative to the repository root, then the arguments
    as given, paths among them (``--out x``, ``--out=x``) made relative to the root too.
    """
    argv = sys.argv if argv is None else argv
    cwd = Path.cwd() if cwd is None else cwd
    args = []
    for token in argv[1:]:
        opt, eq, value = token.partition("=")
        args.append(f"{opt}={_normalize(value, cwd)}" if eq and opt.startswith("--") else _normalize(token, cwd))
    script = Path(os.path.normpath(cwd / argv[0]))
    script_s = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script)
    return shlex.join([PYTHON, script_s, *args])


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def git_state() -> tuple[str, bool]:
    """HEAD's commit, and whether src/ or benchmarks/ (results/ aside) have uncommitted changes."""
    status = _git("status", "--porcelain", "--untracked-files=all", "--", "src", "benchmarks",
                  ":(exclude)benchmarks/results")
    return _git("rev-parse", "HEAD"), bool(status)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """CPU model, core count, OS, the versions that matter and the GPU a benchmark ran on; no hostname."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    os_name = f"{platform.system()} {platform.release()}"
    try:
        os_name += f" ({platform.freedesktop_os_release()['PRETTY_NAME']})"
    except (OSError, KeyError, AttributeError):
        pass
    out = {"cpu": cpu, "cores": os.cpu_count(), "os": os_name, "python": platform.python_version(),
           "numpy": _version("numpy"), "torch": _version("torch")}
    torch = sys.modules.get("torch")  # a GPU benchmark imported it; never imported here for this
    if torch is not None and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def provenance() -> dict[str, Any]:
    """The stamp for a file written now by this process."""
    commit, dirty = git_state()
    return {"command": command(), "commit": commit, "dirty": dirty, "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _target(path: str | Path) -> Path:
    """A relative path is under benchmarks/results/."""
    path = Path(path)
    return path if path.is_absolute() else RESULTS / path


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` fills a temporary file next to ``path``, which then replaces ``path``."""
    path = _target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would have made it
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: str | Path, data: dict) -> Path:
    """``data`` as a JSON object with ``"provenance"`` as its first key."""
    return _write_text(path, json.dumps({"provenance": provenance(), **data}, indent=1, default=str) + "\n")


def markdown_header(stamp: dict) -> str:
    """The front-matter block that opens a Markdown results file."""
    lines = ["# written by the command below: do not edit, re-run it (`make bench` runs them all)"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in stamp.items()]
    return "\n".join([FRONT, *lines, FRONT, "", ""])


def write_markdown(path: str | Path, text: str) -> Path:
    """``text`` under its provenance header."""
    return _write_text(path, markdown_header(provenance()) + text)


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG, its provenance in the PNG's ``provenance`` text chunk."""
    meta = {PNG_KEY: json.dumps(provenance())}
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, metadata=meta, format="png"))


def write_csv(path: str | Path, rows: list[dict]) -> Path:
    """Rows (dicts with the first row's keys) as CSV, provenance in ``<name>.provenance.json``."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(rows)
    path = _write_text(path, buf.getvalue())
    write_json(path.with_name(path.name + SIDECAR), {"file": path.name})
    return path


def _png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG file."""
    data, pos, out = path.read_bytes(), 8, {}
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return out


def read_provenance(path: str | Path) -> dict | None:
    """The provenance a results file carries, or None when it has none."""
    path = Path(path)
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            return data.get("provenance") if isinstance(data, dict) else None
        if path.suffix == ".md":
            lines = path.read_text().splitlines()
            if not lines or lines[0] != FRONT or FRONT not in lines[1:]:
                return None
            block = lines[1:lines.index(FRONT, 1)]
            return {k: json.loads(v) for k, _, v in (ln.partition(": ") for ln in block if not ln.startswith("#"))}
        if path.suffix == ".png":
            text = _png_text(path).get(PNG_KEY)
            return json.loads(text) if text else None
        sidecar = path.with_name(path.name + SIDECAR)
        return read_provenance(sidecar) if sidecar.exists() else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def profiles_absent() -> bool:
    """True (saying so) when ../shared's PipeDream profiles are absent: the caller skips."""
    if PROFILES.is_dir():
        return False
    print(f"skipped: {PROFILES} is absent (PipeDream's profiles, ../shared)")
    return True


def add_out_argument(parser: argparse.ArgumentParser, sub: str = "") -> None:
    """``--out DIR``: where the script writes, default ``benchmarks/results/<sub>``."""
    parser.add_argument("--out", type=lambda s: Path(s).resolve(), default=RESULTS / sub,
                        help=f"output folder (default: benchmarks/results/{sub})")


def add_jobs_argument(parser: argparse.ArgumentParser) -> None:
    """``--jobs N``: worker processes (default: one a CPU). Each task is seeded, so the figures
    do not depend on N, and the command recorded leaves it out (``unrecorded``)."""
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (the figures do not depend on it; not recorded)")


@contextlib.contextmanager
def worker_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` worker processes (spawned, not forked: nothing of this process copied into them).
    A task's failure or a Ctrl-C ends the run at once: the workers are ended and the tasks
    left never run, where leaving the pool's block would first wait for every task."""
    pool = ProcessPoolExecutor(max(jobs, 1), mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    except BaseException:
        for child in multiprocessing.active_children():  # the workers: this script starts no other
            child.terminate()
        pool.shutdown(cancel_futures=True)  # quick now: the pool's thread fails what is left, reaps the workers
        raise
    pool.shutdown()


def unrecorded(valued: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> None:
    """Leave these options out of the command recorded (``valued``: with their value,
    ``--jobs 2`` or ``--jobs=2``; ``flags``: alone): they change how a run is carried out,
    not its figures."""
    argv, out, i = sys.argv, [], 0
    while i < len(argv):
        name, eq, _ = argv[i].partition("=")
        i += 2 if name in valued and not eq else 1
        if name not in valued and name not in flags:
            out.append(argv[i - 1])
    sys.argv[:] = out
