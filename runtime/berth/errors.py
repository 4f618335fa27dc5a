"""The one exception type the CLI turns into a one-line error message (and
its kinds), and the SIGTERM that unwinds a long verb."""


import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BerthError(Exception):
    """A user-facing failure: the message names the input that caused it;
    `status` is the exit status the CLI ends with (1, any failure, unless
    one of porcelain.STATUSES tells a program more)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def one_line(message):
    """`message` on one line: the control characters a name may carry (a
    newline in a reference, say) written as escapes, as Python writes them."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], message)


class Permanent(BerthError):
    """A failure that asking again will not mend, as the image's name or the
    caller's login stand: the SPANK plugin refuses a job at submission on
    it (see porcelain.STATUSES), where one that may pass is left to the
    nodes to try again."""


class AccessDenied(Permanent):
    """A registry refused the image to this caller (401, 403): a login is missing or wrong."""


class ImageNotFound(Permanent):
    """A registry has no such manifest (404), or hides a private one from this caller."""


class UnknownHost(Permanent):
    """A registry's name does not exist (the resolver says so): mistyped."""


class Terminated(Exception):
    """SIGTERM, unwinding an import: no BerthError, so that no handler of
    bad input (a broken layer, say) takes it for one and waits on."""


def raise_terminated(signum, frame):
    """The SIGTERM handler of import and store serve (scancel, a step's end,
    systemd): unwind, so that cleanups run."""
    raise Terminated()
