"""Exceptions: ``PipeplanError`` is what a user can cause (the CLI prints it as one line and
exits 2); ``Infeasible`` is what a search meets (a candidate that cannot run) and handles;
``Terminated`` is SIGTERM at the CLI (one line, exit 143)."""


class PipeplanError(ValueError):
    """Bad input or an impossible request; the message names what is wrong and where."""


class Infeasible(Exception):
    """A candidate plan cannot run (no link between two stages that must talk, a schedule
    that deadlocks, ...). Searches skip it; reaching a user, it reads as one line."""


class Terminated(BaseException):
    """SIGTERM arrived: the command unwinds as after Ctrl-C (worker processes ended, partial
    outputs removed); a ``BaseException`` like ``KeyboardInterrupt``, so that no handler of
    ``Exception`` takes it for a failure."""
