"""berth_toml: render a mapping from the inventory as a TOML document.

Enough TOML for Environment Definition Files: strings, booleans, integers,
arrays of those, and tables (top-level mappings become [sections], deeper
ones inline tables). Keys that are not bare TOML keys are quoted, so
`com.hooks.pmix.enable` stays one key. The runtime validates what the EDF
means; this only writes what it is given, and refuses what TOML cannot say.
"""

import re
from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

DOCUMENTATION = """
name: berth_toml
short_description: render a mapping as a TOML document
description:
  - Renders strings, booleans, integers, arrays and tables as TOML.
  - Top-level mappings become C([table]) sections, deeper ones inline tables.
positional: _input
options:
  _input:
    description: The mapping to render.
    type: dict
    required: true
"""

EXAMPLES = """
edf_text: "{{ {'image': 'nvcr.io#nvidia/pytorch:24.01-py3', 'env': {'A': '1'}} | berth_toml }}"
# image = "nvcr.io#nvidia/pytorch:24.01-py3"
#
# [env]
# A = "1"
"""

RETURN = """
_value:
  description: The TOML text, ending in a newline.
  type: str
"""

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
            "\f": "\\f", "\r": "\\r"}


def _string(text):
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key, where):
    if not isinstance(key, str) or not key:
        raise AnsibleFilterError(f"berth_toml: {where}: key {key!r} is not a non-empty string")
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        items = [f"{_key(k, where)} = {_value(v, f'{where}.{k}')}" for k, v in value.items()]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    raise AnsibleFilterError(
        f"berth_toml: {where}: {type(value).__name__} {value!r} has no TOML form here "
        "(strings, booleans, integers, arrays and tables only)")


def berth_toml(data):
    if not isinstance(data, Mapping):
        raise AnsibleFilterError(f"berth_toml: expected a mapping, got {type(data).__name__}")
    # TOML needs every plain key before the first [section].
    lines = [f"{_key(k, k)} = {_value(v, k)}" for k, v in data.items()
             if not isinstance(v, Mapping)]
    for name, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{_key(name, name)}]"]
            lines += [f"{_key(k, f'{name}.{k}')} = {_value(v, f'{name}.{k}')}"
                      for k, v in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


class FilterModule:
    def filters(self):
        return {"berth_toml": berth_toml}
