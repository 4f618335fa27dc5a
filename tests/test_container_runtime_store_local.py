"""roles/container_runtime's container_runtime_image_store_local: rendered
into enroot.conf (through the enroot_conf module, read back by the
runtime) only when set, made writable to the store's service unit, and
refused by the preflight where the runtime would refuse it."""

import sys
from pathlib import Path

import pytest
import yaml

from ansible_module import run_playbook

REPO = Path(__file__).resolve().parent.parent
ROLE = REPO / "roles" / "container_runtime"
sys.path.insert(0, str(REPO / "runtime"))
from berth import config  # noqa: E402
from berth.store import paths as store  # noqa: E402


def _preflight_tasks():
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    return [t for t in tasks if t["name"].startswith(("Check the directory of the node-local",
                                                      "Check that a cap of the node-local",
                                                      "Check the size limits"))]


def play(tmp_path, **overrides):
    """The role's defaults and vars, `overrides` over them; runs the
    preflight's check, writes enroot.conf and the serve unit into tmp_path.
    Returns (returncode, output)."""
    tasks = [
        *_preflight_tasks(),
        {"name": "Write enroot.conf", "enroot_conf": {
            "path": str(tmp_path / "enroot.conf"), "mode": "0644",
            "settings": "{{ container_runtime_enroot_settings }}"}},
        {"name": "Write the serve unit", "ansible.builtin.template": {
            "src": str(ROLE / "templates" / "berth-store@.service.j2"),
            "dest": str(tmp_path / "berth-store@.service"), "mode": "0644"}},
    ]
    playbook = [{"hosts": "localhost", "gather_facts": False,
                 "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
                 "tasks": tasks}]
    # (extra vars: over the role's defaults, as an inventory's would be)
    return run_playbook(tmp_path, playbook, {
        "container_runtime_storage_root": "/var/lib/berth",
        "container_runtime_venv": "/opt/berth/venv", **overrides},
        ANSIBLE_LIBRARY=str(REPO / "library"),
        ANSIBLE_MODULE_UTILS=str(REPO / "plugins" / "module_utils"),
        ANSIBLE_FILTER_PLUGINS=str(REPO / "plugins" / "filter"))


def _runtime(tmp_path):
    return config.load({"ENROOT_SYSCONF_PATH": str(tmp_path), "HOME": "/home/u"})


def test_unset_renders_nothing_new(tmp_path):
    code, out = play(tmp_path, container_runtime_image_store="/shared/store")
    assert code == 0, out
    assert "BERTH_IMAGE_STORE_LOCAL" not in (tmp_path / "enroot.conf").read_text()
    assert store.local_path(_runtime(tmp_path)) is None
    unit = (tmp_path / "berth-store@.service").read_text()
    assert [line for line in unit.splitlines() if line.startswith("ReadWritePaths=")] == [
        "ReadWritePaths=/shared/store"]


def test_set_renders_the_key_and_lets_serve_write_there(tmp_path):
    code, out = play(tmp_path, container_runtime_image_store="/shared/store",
                     container_runtime_image_store_local="/var/lib/berth-store-local")
    assert code == 0, out
    assert "BERTH_IMAGE_STORE_LOCAL /var/lib/berth-store-local\n" in \
        (tmp_path / "enroot.conf").read_text()
    assert store.local_path(_runtime(tmp_path)) == "/var/lib/berth-store-local"
    unit = (tmp_path / "berth-store@.service").read_text()
    assert [line for line in unit.splitlines() if line.startswith("ReadWritePaths=")] == [
        "ReadWritePaths=/shared/store", "ReadWritePaths=/var/lib/berth-store-local"]


@pytest.mark.parametrize("store_dir, local", [
    ("", "/var/lib/berth-store-local"),
    ("/shared/store", "local"),
    ("/shared/store", "/shared/store/local"),
    ("/shared/store/", "/shared/store"),
])
def test_the_preflight_refuses_what_the_runtime_would(tmp_path, store_dir, local):
    code, out = play(tmp_path, container_runtime_image_store=store_dir,
                     container_runtime_image_store_local=local)
    assert code != 0
    assert f"container_runtime_image_store_local={local}: must be an absolute node-local path" \
        in out
    assert not (tmp_path / "enroot.conf").exists()


def test_a_sibling_with_the_stores_name_as_prefix_is_fine(tmp_path):
    code, out = play(tmp_path, container_runtime_image_store="/shared/store",
                     container_runtime_image_store_local="/shared/store-local")
    assert code == 0, out
    assert store.local_path(_runtime(tmp_path)) == "/shared/store-local"


def test_a_cap_of_the_copies_is_rendered_and_read_by_the_runtime(tmp_path):
    code, out = play(tmp_path, container_runtime_image_store="/shared/store",
                     container_runtime_image_store_local="/var/lib/berth-store-local",
                     container_runtime_image_store_local_max_size="500G")
    assert code == 0, out
    assert "BERTH_IMAGE_STORE_LOCAL_MAX_SIZE 500G\n" in (tmp_path / "enroot.conf").read_text()
    assert store.local_limit(_runtime(tmp_path)) == 500 * 2**30


@pytest.mark.parametrize("local, max_size, message", [
    ("", "500G", "container_runtime_image_store_local_max_size=500G\nis set but "
                 "container_runtime_image_store_local is empty"),
    ("/var/lib/berth-store-local", "lots",
     "container_runtime_image_store_local_max_size=lots: expected bytes or a"),
])
def test_the_preflight_refuses_a_cap_the_runtime_would(tmp_path, local, max_size, message):
    code, out = play(tmp_path, container_runtime_image_store="/shared/store",
                     container_runtime_image_store_local=local,
                     container_runtime_image_store_local_max_size=max_size)
    assert code != 0
    assert " ".join(message.split()) in " ".join(out.split()), out
    assert not (tmp_path / "enroot.conf").exists()
