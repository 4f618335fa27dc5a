"""The one exception type the CLI turns into a one-line error message."""


class BerthError(Exception):
    """A user-facing failure: the message names the input that caused it."""


class AccessDenied(BerthError):
    """A registry refused the image to this caller (401, 403): a login is missing or wrong."""


class ImageNotFound(BerthError):
    """A registry has no such manifest (404), or hides a private one from this caller."""
