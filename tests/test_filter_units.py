"""plugins/filter/berth_units.py and container_runtime's preflight of the
sizes it hands to `berth cache prune` and `berth store prune`: what the
runtime accepts passes, what it refuses is refused before any change, by
the runtime's own grammar (runtime/berth/units.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from ansible_module import run_playbook

REPO = Path(__file__).resolve().parent.parent
ROLE = REPO / "roles" / "container_runtime"
sys.path.insert(0, str(REPO / "runtime"))
from berth.errors import BerthError  # noqa: E402
from berth.image.verbs import parse_size  # noqa: E402

_SPEC = importlib.util.spec_from_file_location("berth_units_filter",
                                               REPO / "plugins" / "filter" / "berth_units.py")
FILTER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(FILTER)
SIZES = ["0", "512", "2K", "3g", "1.5T", "500GB", "500GiB", "20gib", "7MB", "20 G", "twentyG",
         "1.5", ".5G", "5P", "200G\n", "-1", "1e3", ""]


def _runtime(text):
    try:
        return parse_size(text)
    except BerthError:
        return None


@pytest.mark.parametrize("text", SIZES)
def test_the_filter_reads_a_size_as_the_runtime_does(text):
    assert FILTER.FilterModule().filters()["berth_size_bytes"](text) == _runtime(text)


def play(tmp_path, **sizes):
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    [task] = [t for t in tasks if t["name"].startswith("Check the size limits")]
    playbook = [{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]
    return run_playbook(tmp_path, playbook, sizes,
                        ANSIBLE_FILTER_PLUGINS=str(REPO / "plugins" / "filter"))


@pytest.mark.playbook
def test_the_preflight_passes_every_size_the_runtime_takes(tmp_path):
    code, out = play(tmp_path, container_runtime_cache_max_size="1.5T",
                     container_runtime_image_store_max_size="",
                     container_runtime_image_store_local_max_size="500G")
    assert code == 0, out


@pytest.mark.playbook
def test_the_preflight_refuses_a_size_the_runtime_would(tmp_path):
    code, out = play(tmp_path, container_runtime_cache_max_size="20G",
                     container_runtime_image_store_max_size="20 G",
                     container_runtime_image_store_local_max_size="")
    assert code != 0
    assert "container_runtime_image_store_max_size=20 G: expected bytes or a size such as " \
        "500M or 200G, or \"\" for no limit" in out
