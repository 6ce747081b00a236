"""Exceptions: ``PipeplanError`` is what a user can cause (the CLI prints it as one line and
exits 2); ``Infeasible`` is what a search meets (a candidate that cannot run) and handles;
``Terminated`` is SIGTERM at the CLI (one line, exit 143). ``one_line`` makes any message
that quotes user text safe to print as one line; ``interrupts_deferred`` holds a Ctrl-C or
SIGTERM until work that must not stop half-done is done."""

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator

#: Control characters (C0, DEL, C1) and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class PipeplanError(ValueError):
    """Bad input or an impossible request; the message names what is wrong and where."""


class Infeasible(Exception):
    """A candidate plan cannot run (no link between two stages that must talk, a schedule
    that deadlocks, ...). Searches skip it; reaching a user, it reads as one line."""


class Terminated(BaseException):
    """SIGTERM arrived: the command unwinds as after Ctrl-C (worker processes ended, partial
    outputs removed); a ``BaseException`` like ``KeyboardInterrupt``, so that no handler of
    ``Exception`` takes it for a failure."""


def one_line(text: str) -> str:
    """``text`` with each control character written as its Python escape (a newline as
    ``\\n``, ESC as ``\\x1b``): a path or value quoted in a message cannot break it into
    several lines or move the terminal's cursor."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def interrupted(argv: list[str] | None, how: str) -> str:
    """The one line a command interrupted by ``how`` (Ctrl-C, SIGTERM) prints: its name when
    one was given (``argv``: the arguments, None for the process's own)."""
    import sys

    words = sys.argv[1:] if argv is None else argv
    command = f"{one_line(words[0])} " if words and not words[0].startswith("-") else ""
    return f"pipeplan: {command}interrupted ({how})"


def from_ctrl_c(e: BaseException) -> bool:
    """``e`` was raised because of a Ctrl-C: a KeyboardInterrupt somewhere in its chain of
    causes (Python wraps one raised during an import, or in a class body's ``__set_name__``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) or SIGTERM that comes during the block and deliver the first after,
    for work that must not stop half-done: numba compiling the kernels through llvmlite's ctypes
    callbacks (which swallow the exception a handler raises: the command would run on),
    multiprocessing making a semaphore (registered with its resource tracker but not yet set
    to be removed at exit: the tracker warns of a leak). Outside the main thread (no signal
    handlers there) it holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append((signum, frame)))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signum, frame = caught[0]
            if callable(previous[signum]):
                previous[signum](signum, frame)  # Python's SIGINT handler raises KeyboardInterrupt
            elif previous[signum] == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
