"""berth_os_vars_files: the family's vars file, then the release's where the
role has one; facts without the release are refused by name. Every role with
per-OS names loads them through it, and each of their vars files is read on
some platform docs/admin/prerequisites.md lists."""

import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "filter"))
from berth_os_vars import berth_os_vars_files

DEBIAN_13 = {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "13"}


def test_family_then_release(tmp_path):
    (tmp_path / "Debian.yml").write_text("{}\n")
    (tmp_path / "Debian-13.yml").write_text("{}\n")
    assert berth_os_vars_files(str(tmp_path), DEBIAN_13) == [
        str(tmp_path / "Debian.yml"), str(tmp_path / "Debian-13.yml")]


def test_a_release_without_a_file_takes_the_familys_alone(tmp_path):
    (tmp_path / "Debian.yml").write_text("{}\n")
    (tmp_path / "Debian-13.yml").write_text("{}\n")
    facts = {**DEBIAN_13, "distribution_major_version": "12"}
    assert berth_os_vars_files(str(tmp_path), facts) == [str(tmp_path / "Debian.yml")]


@pytest.mark.parametrize("facts", [{}, {**DEBIAN_13, "distribution_major_version": ""},
                                   {**DEBIAN_13, "os_family": None}, "Debian"])
def test_facts_without_the_release_are_refused(tmp_path, facts):
    with pytest.raises(AnsibleFilterError, match="need os_family, distribution, "
                                                 "distribution_major_version"):
        berth_os_vars_files(str(tmp_path), facts)


# One way for every role: the roles with per-OS names (a vars file besides
# main.yml) load them through the os_vars role, imported by tasks/main.yml
# before anything reads them, and nothing else in a role loads a vars file.
ROLES = Path(__file__).resolve().parents[1] / "roles"
OS_VARS_ROLES = sorted(role for role in ROLES.iterdir()
                       if any(f.name != "main.yml" for f in (role / "vars").glob("*.yml")))
# the facts of each platform docs/admin/prerequisites.md lists
PLATFORM_FACTS = [{"os_family": family, "distribution": distro, "distribution_major_version": major}
                  for family, distro, major in [("Debian", "Debian", "12"), ("Debian", "Debian", "13"),
                                                ("Debian", "Ubuntu", "22"), ("Debian", "Ubuntu", "24"),
                                                ("RedHat", "RedHat", "9"), ("RedHat", "Rocky", "9"),
                                                ("RedHat", "AlmaLinux", "9")]]


def test_every_role_with_per_os_names_loads_them_through_the_os_vars_role():
    assert [role.name for role in OS_VARS_ROLES] == [
        "container_runtime", "munge", "slurm", "slurm_dbd", "spank_plugin"]
    loader = ROLES / "os_vars" / "tasks" / "main.yml"
    assert "berth_os_vars_files(ansible_facts)" in loader.read_text()
    for role in OS_VARS_ROLES:
        assert not (role / "tasks" / "os_vars.yml").exists(), role.name
        tasks = yaml.safe_load((role / "tasks" / "main.yml").read_text())
        assert {"name": "os_vars"} in [task.get("ansible.builtin.import_role") for task in tasks], role.name
    for task in ROLES.glob("*/tasks/*.yml"):
        if task != loader:
            assert "include_vars" not in task.read_text(), task


def test_every_vars_file_is_read_on_some_platform():
    for role in OS_VARS_ROLES:
        read = {path for facts in PLATFORM_FACTS
                for path in berth_os_vars_files(str(role / "vars"), facts)}
        files = {str(f) for f in (role / "vars").glob("*.yml") if f.name != "main.yml"}
        assert files == read, role.name
