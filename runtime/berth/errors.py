"""The one exception type the CLI turns into a one-line error message."""


class BerthError(Exception):
    """A user-facing failure: the message names the input that caused it."""
