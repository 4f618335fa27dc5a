"""Sizes and durations as berth's options and the roles' variables write
them (`--max-size 20G`, `--older-than 30d`): the one grammar of each, and
a size as berth's messages write it (human_size).

The runtime reads them here (cache and store prune); so does the
controller, for the roles' checks of the same values (plugins/filter/
berth_units.py, roles/registry_cache), loading this file alone: it imports
nothing of berth.
"""

import math
import re

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGT]?)(?:I?B)?", re.IGNORECASE)
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw]?)", re.IGNORECASE)
_WHOLE = re.compile(r"[0-9]{1,100}")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def size(text):
    """Bytes: bytes, or a number with K, M, G or T (powers of 1024; B or iB
    may follow, in any case); None when `text` is no size."""
    match = _SIZE.fullmatch(text)
    value = float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " ") if match else None
    return int(value) if value is not None and math.isfinite(value) else None  # (300 digits: inf)


def seconds(text):
    """Seconds: a number with s, m, h, d or w (alone: days); None when `text`
    is no duration."""
    match = _DURATION.fullmatch(text)
    value = float(match[1]) * _SECONDS[match[2].lower()] if match else None
    return value if value is not None and math.isfinite(value) else None


def whole(text):
    """The whole number `text` writes in ASCII digits, or None: not for
    str.isdigit(), which takes '²' (that int() refuses) and other scripts'
    digits, nor for int() alone, which takes spaces and '_' and refuses
    4,300 digits or more. At most 100 digits: past any count Berth reads."""
    return int(text) if _WHOLE.fullmatch(text) else None


def human_size(size):
    """Bytes as people read them: 512B, 1.5K, 20.0G (powers of 1024)."""
    for unit in "BKMG":
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"
