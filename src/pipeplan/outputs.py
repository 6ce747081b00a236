"""The output files of one command: every target checked before any work is done, and all
written together or none.

A target must be a new name or a regular file (not a directory, device, FIFO, socket or
symlink), in a place where a file can be created, with an extension that names a format
the output has. Each file is written to a temporary file beside it and renamed over the
target only once every output of the command is written; new files get the umask's mode,
a replaced file keeps its own mode, owner and group (a file whose owner or group the user
could not give the new one, i.e. another user's file when not running as root, is refused
before any work).
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import PipeplanError

#: Formats by kind of output (the extension decides; anything else is refused).
FORMATS = {"json": (".json",), "yaml": (".yaml", ".yml"), "figure": (".png", ".svg", ".pdf"),
           "checkpoint": (".pt",), "csv": (".csv",), "toml": (".toml",), "npz": (".npz",),
           "sh": (".sh",), "py": (".py",), "html": (".html",)}


@dataclass
class _Output:
    option: str
    path: Path
    formats: tuple[str, ...]
    write: Callable[[str], None] | None = None


def _existing_ancestor(path: Path) -> Path:
    """The nearest folder on the way to ``path`` that exists (or the first that is not a folder)."""
    a = path.parent
    while not os.path.lexists(a) and a != a.parent:
        a = a.parent
    return a


def check_folder(option: str, path: str) -> Path:
    """``path`` as a folder ``option`` writes files into: not a symbolic link (files would land
    where it points), a folder if it exists."""
    p = Path(path)
    if os.path.islink(p):
        raise PipeplanError(f"{option} {path}: is a symbolic link; name the folder it points to ({os.path.realpath(p)})")
    if os.path.lexists(p) and not p.is_dir():
        raise PipeplanError(f"{option} {path}: is not a folder")
    return p


def check_target(option: str, path: str, formats: tuple[str, ...]) -> Path:
    """``path`` as a safe target for ``option``, or PipeplanError saying why not."""
    p = Path(path)
    where = f"{option} {path}"
    if os.path.islink(p):
        raise PipeplanError(f"{where}: is a symbolic link; name the file it points to ({os.path.realpath(p)})")
    if os.path.lexists(p):
        mode = os.stat(p).st_mode
        if stat.S_ISDIR(mode):
            raise PipeplanError(f"{where}: is a directory; name a file in it")
        if not stat.S_ISREG(mode):
            raise PipeplanError(f"{where}: is not a regular file (a device, FIFO or socket); name a file")
        if not os.access(p, os.W_OK):
            raise PipeplanError(f"{where}: the file is not writable")
        if not _can_give_owner(os.stat(p)):
            raise PipeplanError(f"{where}: the file belongs to another user or group; replacing it would change its "
                                "owner (remove it first, or name another file)")
    if p.suffix.lower() not in formats:
        raise PipeplanError(f"{where}: the extension decides the format; use {', '.join(formats)}")
    folder = _existing_ancestor(p)
    if not folder.is_dir():
        raise PipeplanError(f"{where}: {folder} is not a directory")
    try:  # the only sure test that files can be created there (read-only mounts, /proc, ...)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".pipeplan-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PipeplanError(f"{where}: cannot create a file in {folder} ({e.strerror})") from None
    return p


def _can_give_owner(st: os.stat_result) -> bool:
    """Can this process give a new file ``st``'s owner and group (``os.chown``)?"""
    if os.geteuid() == 0:
        return True
    return st.st_uid == os.geteuid() and (st.st_gid == os.getegid() or st.st_gid in os.getgroups())


def _keep_owner(tmp: str, target: Path) -> None:
    """Give ``tmp`` the owner and group of the file it will replace, when they differ."""
    if target.is_file():
        st = os.stat(target)
        if (st.st_uid, st.st_gid) != (os.stat(tmp).st_uid, os.stat(tmp).st_gid):
            os.chown(tmp, st.st_uid, st.st_gid)


def _mode_for(target: Path) -> int:
    if target.is_file():
        return stat.S_IMODE(os.stat(target).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _put_back(kept: list[tuple[str | None, "_Output"]]) -> None:
    """Undo the renames done: each replaced file back from its copy, a new one removed."""
    for copy, out in reversed(kept):
        try:
            if copy is not None:
                os.replace(copy, out.path)
            elif os.path.isfile(out.path):
                os.unlink(out.path)
        except OSError:
            pass  # the original error is the one to report


class Outputs:
    """The outputs a command will write: ``want`` each (checked at once), ``set`` how to
    write it once the work is done, then ``write_all``."""

    def __init__(self) -> None:
        self._items: dict[str, _Output] = {}

    def want(self, option: str, path: str | None, kind: str) -> None:
        if path is not None:
            self._items[option] = _Output(option, check_target(option, path, FORMATS[kind]), FORMATS[kind])

    def set(self, option: str, write: Callable[[str], None]) -> None:
        """``write(path)`` writes the output to a path (a temporary file beside the target)."""
        if option in self._items:
            self._items[option].write = write

    def write_all(self) -> None:
        """Write every output that was set to a temporary file, check every target again (it
        may have changed while the work ran), then rename them all; a rename that fails puts
        back what the ones before it replaced, so that "nothing was written" stays true."""
        done: list[tuple[str, _Output]] = []
        kept: list[tuple[str | None, _Output]] = []  # (the replaced file's copy, or None: there was none)
        try:
            for out in self._items.values():
                if out.write is None:
                    continue
                tmp = self._temporary(out)
                done.append((tmp, out))
                out.write(tmp)
                _keep_owner(tmp, out.path)
                os.chmod(tmp, _mode_for(out.path))
            for _, out in done:
                check_target(out.option, str(out.path), out.formats)
            for tmp, out in done:
                kept.append((self._keep(out), out))
                os.replace(tmp, out.path)
        except (OSError, PipeplanError) as e:
            _put_back(kept)
            why = e.strerror or e if isinstance(e, OSError) else str(e).split(": ", 1)[-1]
            raise PipeplanError(f"{out.option} {out.path}: cannot write ({why}); nothing was written") from None
        finally:
            for path in [tmp for tmp, _ in done] + [copy for copy, _ in kept if copy]:
                if os.path.exists(path):
                    os.unlink(path)

    @staticmethod
    def _keep(out: _Output) -> str | None:
        """A hard link to the file ``out`` is about to replace (None: there is none)."""
        if not os.path.isfile(out.path):
            return None
        copy = tempfile.mktemp(dir=out.path.parent, prefix=".pipeplan-kept-")
        os.link(out.path, copy)
        return copy

    @staticmethod
    def _temporary(out: _Output) -> str:
        try:
            out.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PipeplanError(f"{out.option} {out.path}: cannot create its folder ({e.strerror})") from None
        fd, tmp = tempfile.mkstemp(dir=out.path.parent, prefix=".pipeplan-", suffix=out.path.suffix)
        os.close(fd)
        return tmp
