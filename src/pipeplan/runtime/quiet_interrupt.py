"""Imported first by the workers' fork server (``launch._context``), before torch: a Ctrl-C
while the server imports torch, or in a worker it starts, ends that process at once and
silently (exit 130); one that came before this import, held blocked since the launcher
spawned the server (``launch._start_server``), arrives here. The launcher gets the same Ctrl-C and says so in its one line; it ends
the workers that are left (``launch.end_all``).

A worker interrupted while it starts can also find what the launcher handed it gone (its
queue's semaphore, its pipe): the fork server prints that failure through ``sys.excepthook``,
which here stays silent for those signs of an interrupted launcher and prints every other
failure as Python does. ``launch._entry`` puts Python's own hook back once the worker runs."""

from __future__ import annotations

import os
import signal
import sys


def _quiet(signum: int, frame: object) -> None:
    os._exit(128 + signal.SIGINT)


def _bootstrap_failed(kind: type, value: BaseException, tb: object) -> None:
    if isinstance(value, (FileNotFoundError, EOFError, ConnectionError)):
        return  # the launcher took back what it handed over: it was interrupted
    sys.__excepthook__(kind, value, tb)


signal.signal(signal.SIGINT, _quiet)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # the launcher spawned this server with it blocked
sys.excepthook = _bootstrap_failed
