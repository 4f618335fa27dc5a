"""berth_toml: render a mapping from the inventory as a TOML document.

Enough TOML for Environment Definition Files: strings, booleans, integers,
arrays of those, and tables (top-level mappings become [sections], deeper
ones inline tables). Keys that are not bare TOML keys are quoted, so
`com.hooks.pmix.enable` stays one key. The runtime validates what the EDF
means; this only writes what it is given, and refuses what TOML cannot say.
The writing is the runtime's (runtime/berth/tomlwrite.py), Berth's one TOML
writer.
"""

import importlib.util
from pathlib import Path

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


def _writer():
    """The runtime's TOML writer, loaded by its path in this checkout: the
    controller need not have the runtime installed."""
    path = Path(__file__).resolve().parents[2] / "runtime" / "berth" / "tomlwrite.py"
    spec = importlib.util.spec_from_file_location("berth_tomlwrite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TOML = _writer()


def berth_toml(data):
    try:
        return _TOML.document(data)
    except ValueError as e:
        raise AnsibleFilterError(f"berth_toml: {e}") from None


class FilterModule:
    def filters(self):
        return {"berth_toml": berth_toml}
