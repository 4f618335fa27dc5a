"""plugins/filter/berth_toml.py: YAML data in, TOML that tomllib reads back the same."""

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))
_spec = importlib.util.spec_from_file_location(
    "berth_toml", REPO / "plugins" / "filter" / "berth_toml.py")
berth_toml_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(berth_toml_module)
berth_toml = berth_toml_module.FilterModule().filters()["berth_toml"]


def test_edf_round_trips():
    edf = {
        "base_environment": ["site-defaults", "group"],
        "image": "nvcr.io#nvidia/pytorch:24.01-py3",
        "env": {"CONFDIR": "/workdir/configs", "ODD KEY": 'q"b\\s\tn\nu\x01d\x7f\u00e9'},
        "entrypoint": False,
        "mounts": ["${SCRATCH}/data:/workdir/data", "/configs:/workdir/configs:ro"],
        "annotations": {"com.hooks.pmix.enable": True, "count": 3,
                        "nested": {"a-b": ["x", 1]}},
        "writable": True,
    }
    text = berth_toml(edf)
    assert tomllib.loads(text) == edf
    # plain keys first, then the tables, which TOML requires
    assert text.index("writable = true") < text.index("[env]")
    assert '"com.hooks.pmix.enable" = true' in text


def test_empty_mapping_is_an_empty_document():
    assert tomllib.loads(berth_toml({})) == {}


@pytest.mark.parametrize("data, message", [
    ({"ratio": 0.5}, "berth_toml: ratio: float 0.5 has no TOML form here"),
    ({"env": {"X": None}}, "berth_toml: env.X: NoneType None has no TOML form here"),
    ({"mounts": ["/a:/b", 2.0]}, "berth_toml: mounts[1]: float 2.0 has no TOML form here"),
    ({"env": {"": "x"}}, "berth_toml: env.: key '' is not a non-empty string"),
    (["not", "a", "mapping"], "berth_toml: expected a mapping, got list"),
])
def test_unrepresentable_input_names_the_key(data, message):
    with pytest.raises(AnsibleFilterError, match="^" + re.escape(message)):
        berth_toml(data)


def test_the_filters_write_with_the_runtimes_writer():
    """One TOML writer: the EDF and registries.conf filters load
    runtime/berth/tomlwrite.py, which `berth edf show` uses too."""
    writer = REPO / "runtime" / "berth" / "tomlwrite.py"
    spec = importlib.util.spec_from_file_location(
        "cr_registries", REPO / "roles" / "container_runtime" / "filter_plugins" / "registries.py")
    registries = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(registries)
    assert Path(berth_toml_module._TOML.__file__) == writer
    assert Path(registries.tomlwrite.__file__) == writer
    from berth.site import edf  # (the runtime of this checkout: sys.path above)
    assert Path(edf.tomlwrite.__file__) == writer
