"""Exceptions: ``PipeplanError`` is what a user can cause (the CLI prints it as one line and
exits 2); ``Infeasible`` is what a search meets (a candidate that cannot run) and handles."""


class PipeplanError(ValueError):
    """Bad input or an impossible request; the message names what is wrong and where."""


class Infeasible(Exception):
    """A candidate plan cannot run (no link between two stages that must talk, a schedule
    that deadlocks, ...). Searches skip it; reaching a user, it reads as one line."""
