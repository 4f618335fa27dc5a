"""berth_size_bytes: a size as the runtime reads it, for the roles' checks
of the sizes they hand to it.

    '1.5T' | berth_size_bytes  -> 1649267441664
    '20 G' | berth_size_bytes  -> None (no size: the runtime would refuse it)

The grammar is the runtime's own, runtime/berth/units.py of this checkout,
loaded alone (it imports nothing of berth) under a name of its own, so that
a berth installed on the controller, of another version, plays no part.
"""

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "berth_units_of_the_runtime", Path(__file__).resolve().parents[2] / "runtime/berth/units.py")
units = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(units)


def berth_size_bytes(text):
    return units.size(text)


class FilterModule:
    def filters(self):
        return {"berth_size_bytes": berth_size_bytes}
