"""The container_runtime role's preflight: which enroot.conf paths it takes
as per user. It must take the forms a site's enroot.conf has (pyxis's guide
writes $(id -u)), as the runtime reads them, and refuse a shared path."""

import re
from pathlib import Path

import pytest
import yaml

ROLE = Path(__file__).resolve().parent.parent / "roles/container_runtime"


def pattern():
    return yaml.safe_load((ROLE / "vars/main.yml").read_text())["container_runtime_per_user_pattern"]


def test_the_preflight_checks_the_user_paths_with_the_pattern():
    tasks = yaml.safe_load((ROLE / "tasks/preflight.yml").read_text())
    check = next(t for t in tasks if t["name"].endswith("paths are per user"))
    assert check["ansible.builtin.assert"]["that"] == (
        "container_runtime_enroot_settings[item] is search(container_runtime_per_user_pattern)")


@pytest.mark.parametrize("path", [
    "/run/enroot/user-$(id -u)", "/tmp/enroot-data/user-$( id -u )", "/d/$(id -un)/x",
    "/d/$(whoami)", "/var/lib/berth/data/${UID}", "/d/$USER", "${HOME}/.cache/enroot",
    "~/.local/share/enroot", "~",
])
def test_per_user_forms_pass(path):
    assert re.search(pattern(), path)


@pytest.mark.parametrize("path", [
    "/raid/enroot-cache/group-$(id -g)", "/var/lib/berth/data", "/d/$UIDS", "/d/${USERX}",
    "/d/$(id -g)", "/d/~", "/d/$(hostname)",
])
def test_shared_paths_fail(path):
    assert not re.search(pattern(), path)
