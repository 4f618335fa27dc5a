"""The test tiers of tests/ and runtime/tests (pytest.ini names the markers).

A test is marked by what it needs: by a fixture it uses, by a mark of its own
(`@pytest.mark.playbook` on the few tests of tests/ that still run a module or
a role's tasks through ansible-playbook), or by its module in NEEDS below
(runtime/tests also runs in a container without this file, so its modules
carry no marks). A test that needs none of them is `unit`, and runs with
BERTH_TEST_TIER=unit, where tests/ansible_module.py refuses to start
ansible-playbook.
tests/test_tiers.py runs the unit tier as an ordinary user without a network,
so that a test which needs more than it is marked for fails there.
"""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
TIERED = (REPO / "tests", REPO / "runtime" / "tests")
NEEDS_ONE_OF = ("root", "namespaces", "playbook", "registry", "cluster", "slow")

# Fixtures that start a server or a container
FIXTURE_NEEDS = {"registry": "registry", "proxy": "registry", "berth": "namespaces"}

# Modules whose every test needs something (paths relative to the repository)
NEEDS = {
    "tests/test_adopt_role.py": "playbook",
    "tests/test_cache_prune_script.py": "root",
    "tests/test_build_buildkit.py": "root",  # the Docker daemon's BuildKit, berth as root
    "tests/test_container_runtime_enroot_link.py": "playbook",
    "tests/test_container_runtime_nvidia_cdi.py": "playbook",  # root: a root-owned spec
    "tests/test_container_runtime_store_local.py": "playbook",
    "tests/test_enroot_hooks.py": "root",  # a cgroup of its own, berth as root
    "tests/test_hook_cxi.py": "root",  # device nodes
    "tests/test_hook_mellanox.py": "root",  # device nodes
    "tests/test_hook_nvidia.py": "root",  # device nodes
    "tests/test_hook_ssh.py": "root",  # a user of its own and an sshd
    "tests/test_login_user_dirs_script.py": "playbook",
    "tests/test_module_berth_spank.py": "slow",  # compiles the plugin
    "tests/test_role_edf_environments.py": "playbook",
    "tests/test_slurm_conf.py": "playbook",
    "tests/test_slurm_release_vars.py": "playbook",
    "tests/test_slurm_role_changes.py": "playbook",
    "tests/test_spank_e2e.py": "cluster",
    "tests/test_spank_plugin.py": "slow",  # compiles the plugin
    "tests/test_userdirs.py": "root",
    "tests/test_validate_playbook.py": "playbook",
    "runtime/tests/test_archive_import.py": "slow",  # squashfs images of each archive
    "runtime/tests/test_build.py": "namespaces",
    "runtime/tests/test_container.py": "namespaces",
    "runtime/tests/test_hooks_std.py": "namespaces",
    "runtime/tests/test_hostile_registry.py": "registry",
    "runtime/tests/test_imagecache.py": "registry",
    "runtime/tests/test_import.py": "registry",
    "runtime/tests/test_isolation.py": "namespaces",
    "runtime/tests/test_layers_fuzz.py": "slow",  # many random layers
    "runtime/tests/test_mounts.py": "namespaces",
    "runtime/tests/test_registry_retries.py": "registry",
    "runtime/tests/test_sif.py": "namespaces",
    "runtime/tests/test_sif_oras.py": "registry",
    "runtime/tests/test_start_uri.py": "registry",
    "runtime/tests/test_store.py": "registry",
    "runtime/tests/test_store_local.py": "registry",
    "runtime/tests/test_store_prune.py": "root",  # plays the store's account
    "runtime/tests/test_syscalls.py": "namespaces",
    "runtime/tests/test_transport.py": "registry",
    "runtime/tests/test_userns.py": "namespaces",
}

# Single tests that need root in a module of unit tests
TEST_NEEDS = {
    "runtime/tests/test_safedir.py::test_group_write_by_another_group_is_refused": "root",
    "runtime/tests/test_safedir.py::test_another_users_dir_or_symlink_is_refused": "root",
}


def _needs(item):
    needs = {mark.name for mark in item.iter_markers() if mark.name in NEEDS_ONE_OF}
    needs.update(FIXTURE_NEEDS[name] for name in item.fixturenames if name in FIXTURE_NEEDS)
    module = item.path.relative_to(REPO).as_posix()
    for need in (NEEDS.get(module), TEST_NEEDS.get(f"{module}::{item.originalname}")):
        if need:
            needs.add(need)
    return needs


def pytest_itemcollected(item):
    if not any(item.path.is_relative_to(tree) for tree in TIERED):
        return
    needs = _needs(item)
    for name in sorted(needs) or ["unit"]:
        item.add_marker(name)


@pytest.fixture(autouse=True)
def _unit_tier_guard(request, monkeypatch):
    """BERTH_TEST_TIER=unit for a test of the unit tier (tests/ansible_module.py reads it)."""
    if request.node.get_closest_marker("unit"):
        monkeypatch.setenv("BERTH_TEST_TIER", "unit")
