"""berth_plugstack_keys: the plugin's plugstack.conf keys from their one
table, spank/plugstack_keys.h, which the plugin's parser includes as C:
{key: {kind, default, min, max}}, in the table's order. A PLUGSTACK_KEY line
this cannot read fails, naming it, rather than leaving a key unchecked."""

import re

from ansible.errors import AnsibleFilterError

_ROW = re.compile(r'PLUGSTACK_KEY\((\w+), +(\w+), +"([^"\\]*)", +(\d+), +(\d+)\)'
                  r'(?: +/\*.*\*/)?')


def berth_plugstack_keys(text):
    keys = {}
    for line in text.splitlines():
        if not line.startswith("PLUGSTACK_KEY("):
            continue
        row = _ROW.fullmatch(line.rstrip())
        if row is None:
            raise AnsibleFilterError(f"berth_plugstack_keys: cannot read '{line}'")
        key, kind, default, low, high = row.groups()
        keys[key] = {"kind": kind, "default": default, "min": int(low), "max": int(high)}
    if not keys:
        raise AnsibleFilterError("berth_plugstack_keys: no PLUGSTACK_KEY line")
    return keys


class FilterModule:
    def filters(self):
        return {"berth_plugstack_keys": berth_plugstack_keys}
