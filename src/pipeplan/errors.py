"""The one exception type a user can cause: the CLI prints it as one line and exits 2."""


class PipeplanError(ValueError):
    """Bad input or an impossible request; the message names what is wrong and where."""
