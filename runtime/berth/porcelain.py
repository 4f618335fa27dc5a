"""--porcelain: the runtime's answer to a program (the SPANK plugin), one
line of KEY=VALUE pairs separated by single spaces, for `import
--cache-only` and `start --detach`. A value is percent-encoded (RFC 3986):
every byte but letters, digits and "-._~/:@" as %XX, so that a path with
spaces, newlines or '=' stays one word of one line.

KEYS is the vocabulary's one table: spank/answer_keys.h, which the plugin's
parser is made of, is generated from it (python scripts/answer_keys.py),
and tests/test_spank_plugin.py holds the two equal. STATUSES, the exit
statuses a program tells apart beyond 0 and 1, likewise makes
spank/answer_status.h."""

import os

# key: (kind, what it says). The kinds, as the plugin checks them:
#   path    an absolute path        digest  sha256: and 64 hex digits
#   yesno   yes or no               pid     a process id, decimal
KEYS = {
    "squashfs": ("path", "the image cache's squashfs of the URI (import --cache-only)"),
    "digest": ("digest", "the digest the image was pulled by"),
    "cached": ("yesno", "yes: the image was there already, nothing was downloaded"),
    "pid": ("pid", "the container's pid, once it is ready (start --detach): its own line"),
}

# name: (exit status, when the runtime ends with it). 1 is any other failure;
# 2 is argparse's (a bad command line), 125 and 126 the plugin's own (child.h).
STATUSES = {
    "permanent": (3, "import --resolve failed for a reason asking again will not mend "
                     "(errors.Permanent: no such host, no such image, access refused)"),
}
PERMANENT = STATUSES["permanent"][0]

# The bytes a value keeps as they are; every other is %XX. (urllib.parse's
# quote with safe="-._~/:@", written out: importing urllib.parse, and the
# ipaddress it imports, would cost every start, the plugin's among them.)
_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/:@")


def _encoded(value):
    return "".join(chr(byte) if byte in _KEPT else f"%{byte:02X}" for byte in os.fsencode(value))


def line(**pairs):
    """One answer line (with its newline) of the given keys, in KEYS's
    order; True/False are yes/no."""
    words = []
    for key in KEYS:
        if key not in pairs:
            continue
        value = pairs.pop(key)
        if isinstance(value, bool):
            value = "yes" if value else "no"
        words.append(f"{key}={_encoded(str(value))}")
    if pairs:
        raise ValueError(f"not in porcelain.KEYS: {', '.join(pairs)}")
    return " ".join(words) + "\n"
