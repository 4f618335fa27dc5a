"""Sizes and durations as berth's options and the roles' variables write
them (`--max-size 20G`, `--older-than 30d`): the one grammar of each.

The runtime reads them here (cache and store prune); so does the
controller, for the roles' checks of the same values (plugins/filter/
berth_units.py, roles/registry_cache), loading this file alone: it imports
nothing of berth.
"""

import re

_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)(?:I?B)?", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def size(text):
    """Bytes: bytes, or a number with K, M, G or T (powers of 1024; B or iB
    may follow, in any case); None when `text` is no size."""
    match = _SIZE.fullmatch(text)
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " ")) \
        if match else None


def seconds(text):
    """Seconds: a number with s, m, h, d or w (alone: days); None when `text`
    is no duration."""
    match = _DURATION.fullmatch(text)
    return float(match[1]) * _SECONDS[match[2].lower()] if match else None
