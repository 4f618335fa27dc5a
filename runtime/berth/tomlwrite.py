"""TOML text, written: Berth's one TOML writer (tomllib only reads).

`berth edf show` writes resolved environments with it, and the Ansible
filters behind EDFs (plugins/filter/berth_toml.py) and registries.conf
(roles/container_runtime) load this file by its path on the controller, so
it imports nothing from berth. Enough TOML for those: strings, booleans,
integers, arrays of those, and tables (top-level mappings become
[sections], deeper ones inline tables). A key that is not a bare TOML key is
quoted, so `com.hooks.pmix.enable` stays one key. ValueError names where a
value has no TOML form here.
"""

import re
from collections.abc import Mapping, Sequence

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
            "\f": "\\f", "\r": "\\r"}


def string(text):
    """A basic string: control characters escaped, the rest as it is."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def key(name, where):
    """A bare key where TOML allows one, else a quoted one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: key {name!r} is not a non-empty string")
    return name if _BARE_KEY.fullmatch(name) else string(name)


def value(data, where):
    """A value on one line: mappings as inline tables."""
    if isinstance(data, bool):
        return "true" if data else "false"
    if isinstance(data, int):
        return str(data)
    if isinstance(data, str):
        return string(data)
    if isinstance(data, Mapping):
        items = [f"{key(k, where)} = {value(v, f'{where}.{k}')}" for k, v in data.items()]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(data, Sequence):
        return "[" + ", ".join(value(v, f"{where}[{i}]") for i, v in enumerate(data)) + "]"
    raise ValueError(
        f"{where}: {type(data).__name__} {data!r} has no TOML form here "
        "(strings, booleans, integers, arrays and tables only)")


def document(data):
    """A whole document, ending in a newline: top-level mappings as [sections]."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    # TOML needs every plain key before the first [section].
    lines = [f"{key(k, k)} = {value(v, k)}" for k, v in data.items()
             if not isinstance(v, Mapping)]
    for name, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{key(name, name)}]"]
            lines += [f"{key(k, f'{name}.{k}')} = {value(v, f'{name}.{k}')}"
                      for k, v in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"
